"""Prompts walked by one checkpoint: the chain on every response (greedy drafting, exact at any
temperature by the path lemma), trees on greedy (T = 0) responses only, and under probabilistic
drafting each response's expected rounds, from the target's own distribution along it (its last
layer, fetched beside the drafter's taps and split off before the drafter sees them)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cache_server.client import TargetHeads
from eval_worker.checkpoints.loaded import LoadedCheckpoint
from eval_worker.errors import FeatureMismatch
from eval_worker.evaluation.feature_cache import Features
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families import FAMILIES
from eval_worker.scoring.summary import round_taus
from schemas.report import ExpectedRounds, PromptEval
from schemas.sampling import GREEDY


@dataclass(frozen=True)
class DeviceHeads:
    """The target's heads on the drafter's device: embedding and lm_head [V, H], and its final RMSNorm
    (weight [H], eps) when probabilistic drafting needs the target's distribution."""

    embed: Tensor
    lm_head: Tensor
    final_norm: tuple[Tensor, float] | None

    @classmethod
    def of(cls, heads: TargetHeads, opts: EvalOptions) -> DeviceHeads:
        """`heads` on `opts`' device and dtype; FeatureMismatch when probabilistic drafting is asked of a
        target whose final norm the cache does not serve (it is not a plain RMSNorm)."""
        embed, lm_head = (t.to(opts.device, opts.dtype) for t in heads.to_torch())
        if opts.draft_sampling != "probabilistic":
            return cls(embed, lm_head, None)
        if heads.final_norm is None or heads.final_norm_eps is None:
            raise FeatureMismatch(
                "probabilistic drafting needs the target's distribution, lm_head(norm(last layer)), and this "
                "target's final norm is not a plain RMSNorm the cache serves: use --draft-sampling greedy"
            )
        weight = torch.from_numpy(heads.final_norm.copy()).to(opts.device, opts.dtype)
        return cls(embed, lm_head, (weight, heads.final_norm_eps))


def fetch_layers(layers: Sequence[int], num_layers: int, opts: EvalOptions) -> list[int]:
    """What to fetch: the checkpoint's layers, and after them the target's last layer when
    probabilistic drafting needs p_T and the drafter does not read it already."""
    last = num_layers - 1
    if opts.draft_sampling == "probabilistic" and last not in layers:
        return [*layers, last]
    return list(layers)


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
    checkpoint: LoadedCheckpoint,
    ids: Sequence[str],
    prompts: Sequence[PromptFeatures],
    features: Sequence[Features],
    lasts: Sequence[Tensor | None],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> dict[str, PromptEval]:
    """Each prompt's evaluation by `checkpoint`: greedy and sampled responses walked apart (trees on
    greedy ones only), then, with probabilistic drafting, every response's expected rounds."""
    out: dict[str, PromptEval] = {}
    for sampled in (False, True):
        part = [i for i, f in enumerate(features) if (f.metadata.sampling is not None) == sampled]
        if not part:
            continue
        family = FAMILIES[checkpoint.family]
        walk_opts = opts.chain_only if sampled else opts
        walked = family.walk(checkpoint, [prompts[i] for i in part], heads.embed, heads.lm_head, walk_opts, cost)
        for i, rounds in zip(part, walked, strict=True):
            meta, prompt = features[i].metadata, prompts[i]
            out[ids[i]] = PromptEval(
                prompt_id=ids[i],
                prompt_len=prompt.prompt_len,
                num_tokens=len(prompt.token_ids),
                chain=round_taus(rounds.chain),
                trees=rounds.trees,
                eagle_trees=rounds.eagle_trees,
                greedy_mismatches=meta.greedy_mismatches,
                generator=meta.generator,
                sampling=meta.sampling_params,
                outside_support=meta.outside_support,
                prompt_sha256=hashlib.sha256(str(prompt.token_ids[: prompt.prompt_len]).encode()).hexdigest()[:16],
            )
    if opts.draft_sampling == "probabilistic" and prompts:
        _add_expected(checkpoint, ids, prompts, features, lasts, heads, opts, cost, out)
    return out


def _add_expected(
    checkpoint: LoadedCheckpoint,
    ids: Sequence[str],
    prompts: Sequence[PromptFeatures],
    features: Sequence[Features],
    lasts: Sequence[Tensor | None],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
    out: dict[str, PromptEval],
) -> None:
    # A greedy response's expectation is its chain walk (the drafts are one-hot and so is p_T: every
    # acceptance is 0 or 1; tested equal bit for bit), so only sampled ones draft at every anchor.
    for pid, f in zip(ids, features, strict=True):
        if f.metadata.sampling is None:
            taus = out[pid].chain.round_taus
            exact = ExpectedRounds(rounds=len(taus), accepted=sum(taus) - len(taus), mean_tau=out[pid].chain.mean)
            out[pid] = out[pid].model_copy(update={"probabilistic": exact})
    sampled = [i for i, f in enumerate(features) if f.metadata.sampling is not None]
    if not sampled:
        return
    if heads.final_norm is None or any(lasts[i] is None for i in sampled):  # fetch_layers and DeviceHeads.of
        raise RuntimeError("probabilistic drafting without the target's last layer or final norm")
    rows = [last.to(opts.device) for i in sampled if (last := lasts[i]) is not None]
    sampling = [features[i].metadata.sampling_params or GREEDY for i in sampled]
    expected = FAMILIES[checkpoint.family].expected(
        checkpoint,
        [prompts[i] for i in sampled],
        rows,
        sampling,
        heads.embed,
        heads.lm_head,
        heads.final_norm,
        opts,
        cost,
    )
    for i, rounds in zip(sampled, expected, strict=True):
        out[ids[i]] = out[ids[i]].model_copy(update={"probabilistic": rounds})
