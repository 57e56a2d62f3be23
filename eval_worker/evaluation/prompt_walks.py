"""Prompts walked by one checkpoint: the chain on every response (greedy drafting, exact at any
temperature by the path lemma), trees on greedy (T = 0) responses only, and under probabilistic
drafting each response's expected rounds, from the target's own distribution along it (its last
layer, fetched beside the drafter's taps and split off before the drafter sees them)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.feature_cache import Features
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, Walked
from eval_worker.families import FAMILIES
from eval_worker.scoring.summary import round_taus
from schemas.report import ExpectedRounds, PromptEval, RoundTaus
from schemas.sampling import GREEDY


def fetch_layers(layers: Sequence[int], num_layers: int, opts: EvalOptions) -> list[int]:
    """What to fetch: the checkpoint's layers, and after them the target's last layer when
    probabilistic drafting needs p_T and the drafter does not read it already."""
    last = num_layers - 1
    if opts.draft_sampling == "probabilistic" and last not in layers:
        return [*layers, last]
    return list(layers)


@dataclass(frozen=True)
class ServedPrompt:
    """One prompt as a checkpoint walks it: its served features (checked), the same on the drafter's
    device (`prompt`), and the target's last layer [T, H] when it was fetched (probabilistic drafting)."""

    prompt_id: str
    features: Features
    prompt: PromptFeatures
    last: Tensor | None

    @property
    def sampled(self) -> bool:
        """Whether its response was sampled at T > 0 (else greedy)."""
        return self.features.metadata.sampling is not None


def serve_prompt(
    prompt_id: str, features: Features, layers: Sequence[int], last: int, opts: EvalOptions
) -> ServedPrompt:
    """The prompt's taps apart from the target's last layer, the taps on the drafter's device and dtype."""
    taps, rows = split_last(features, layers, last)
    on_device = PromptFeatures(
        taps.hidden.to(opts.device, opts.dtype), taps.token_ids.tolist(), taps.metadata.prompt_len
    )
    return ServedPrompt(prompt_id, taps, on_device, rows)


def split_last(features: Features, layers: Sequence[int], last: int) -> tuple[Features, Tensor | None]:
    """The features the drafter reads (checked against `layers` next: anything else served is left for
    that check to refuse) and the last layer's rows [T, H] when they were served (None otherwise)."""
    served, width = features.metadata.layers, features.metadata.hidden_size
    if last not in layers and served == [*layers, last]:  # fetched beside the taps: split off
        taps = features.hidden[:, : len(layers) * width]
        meta = features.metadata.model_copy(update={"layers": list(layers)})
        return Features(taps, features.token_ids, meta), features.hidden[:, len(layers) * width :]
    if last not in served:
        return features, None
    at = served.index(last)
    return features, features.hidden[:, at * width : (at + 1) * width]


def walk_checkpoint(
    checkpoint: LoadedCheckpoint, served: Sequence[ServedPrompt], heads: DeviceHeads, opts: EvalOptions, cost: DraftCost
) -> dict[str, PromptEval]:
    """Each prompt's evaluation by `checkpoint`: greedy and sampled responses walked apart (trees on
    greedy ones only), with probabilistic drafting each response's expected rounds too."""
    out: dict[str, PromptEval] = {}
    family = FAMILIES[checkpoint.family]
    for sampled in (False, True):
        part = [s for s in served if s.sampled == sampled]
        if not part:
            continue
        walk_opts = opts.chain_only if sampled else opts
        walked = family.walk(checkpoint, [s.prompt for s in part], heads, walk_opts, cost)
        chains = [round_taus(rounds.chain) for rounds in walked]
        expected: Sequence[ExpectedRounds | None] = [None] * len(part)
        if opts.draft_sampling == "probabilistic":
            # A greedy response's expectation is its chain walk (one-hot drafts and one-hot p_T: every
            # acceptance is 0 or 1; tested equal bit for bit): only sampled ones draft at every anchor.
            expected = _expected(checkpoint, part, heads, opts, cost) if sampled else list(map(_walked, chains))
        for s, rounds, chain, e in zip(part, walked, chains, expected, strict=True):
            out[s.prompt_id] = _prompt_eval(s, rounds, chain, e)
    return out


def _prompt_eval(s: ServedPrompt, rounds: Walked, chain: RoundTaus, expected: ExpectedRounds | None) -> PromptEval:
    meta, prompt = s.features.metadata, s.prompt
    return PromptEval(
        prompt_id=s.prompt_id,
        prompt_len=prompt.prompt_len,
        num_tokens=len(prompt.token_ids),
        chain=chain,
        trees=rounds.trees,
        eagle_trees=rounds.eagle_trees,
        greedy_mismatches=meta.greedy_mismatches,
        generator=meta.generator,
        capture=meta.capture,
        sampling=meta.sampling_params,
        outside_support=meta.outside_support,
        prompt_sha256=hashlib.sha256(str(prompt.token_ids[: prompt.prompt_len]).encode()).hexdigest()[:16],
        probabilistic=expected,
    )


def _walked(chain: RoundTaus) -> ExpectedRounds:
    """The expectation of a walk whose every acceptance is certain: its own rounds."""
    taus = chain.round_taus
    return ExpectedRounds(rounds=len(taus), accepted=sum(taus) - len(taus), mean_tau=chain.mean)


def _expected(
    checkpoint: LoadedCheckpoint, part: Sequence[ServedPrompt], heads: DeviceHeads, opts: EvalOptions, cost: DraftCost
) -> list[ExpectedRounds]:
    lasts = [s.last for s in part]
    if any(last is None for last in lasts):  # fetch_layers fetched it
        raise RuntimeError("probabilistic drafting without the target's last layer")
    rows = [last.to(opts.device) for last in lasts if last is not None]
    sampling = [s.features.metadata.sampling_params or GREEDY for s in part]
    prompts = [s.prompt for s in part]
    return FAMILIES[checkpoint.family].expected(checkpoint, prompts, rows, sampling, heads, opts, cost)
