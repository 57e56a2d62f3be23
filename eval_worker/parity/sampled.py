"""Parity at T > 0: the engine's own output paths, walked offline.

Each prompt goes to the engine alone at the setting, sample i seeded seed + i (so that the counter
deltas are that request's rounds); its output path is registered on the cache server as a response
sampled at that setting by that engine, and captured. By the path lemma (REFERENCE s.15), under greedy
drafting a draft is accepted iff it is the path's token, so the offline chain walk over that very path
must count the engine's rounds and accepted drafts exactly (`compare.py`, with its end-of-output
allowance). Under probabilistic drafting the live count is random given the path: each sample's exact
expectation is set beside it, and all rounds are judged together (`distribution.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cache_server.client import CacheClient
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.sweep import evaluate_checkpoints
from eval_worker.parity.compare import compare_prompt, first_difference
from eval_worker.parity.distribution import distribution_check
from eval_worker.parity.engine import SpecCounters, VllmEngine
from eval_worker.parity.paths import register_path, split_tokens
from eval_worker.parity.report import RunSetting
from eval_worker.settings import EvaluateSettings
from schemas.eval_spec import EvalSpec
from schemas.parity import DistributionCheck, PromptParity
from schemas.report import ExpectedRounds, PromptEval


@dataclass(frozen=True)
class LiveSample:
    """One request: the cached prompt it came from, its seed, its output path (registered as `path_id`)
    and the engine's counters' deltas over it."""

    source: str
    seed: int
    path_id: str
    output: list[int]
    live: SpecCounters


def sample_live(
    client: CacheClient, engine: VllmEngine, sources: Sequence[str], setting: RunSetting, timeout_s: float
) -> list[LiveSample]:
    """Every source prompt `setting.samples` times on the engine, one request at a time, each output
    registered as a sampled response; waits until all are captured."""
    first_seed = setting.sampling.seed or 0
    out = []
    for source in sources:
        prompt, response = split_tokens(client, source)
        for seed in range(first_seed, first_seed + setting.samples):
            params = setting.sampling.model_copy(update={"seed": seed})
            before = engine.counters()
            output = engine.sample(prompt, len(response), params)
            live = engine.settled_counters() - before
            name = f"parity sample of {source} seed {seed}"
            path = register_path(client, prompt, output, params, engine.generator(), name)
            out.append(LiveSample(source, seed, path, output, live))
    client.wait_ready([s.path_id for s in out], timeout_s=timeout_s)
    return out


def offline_walks(
    client: CacheClient,
    loaded: LoadedCheckpoint,
    settings: EvaluateSettings,
    samples: Sequence[LiveSample],
    setting: RunSetting,
) -> dict[str, PromptEval]:
    """The checkpoint's offline walks over the registered paths (its options draft the engine's K per
    round), by path id."""
    ids = list(dict.fromkeys(s.path_id for s in samples))
    spec = EvalSpec(draft_sampling=setting.draft_sampling)
    [report] = evaluate_checkpoints(
        client, [loaded], settings, spec, prompt_ids=[ids], set_members_of=[{}], progress=False
    )
    return {p.prompt_id: p for p in report.prompts}


def sampled_rows(
    client: CacheClient,
    samples: Sequence[LiveSample],
    walks: dict[str, PromptEval],
    k: int,
    setting: RunSetting,
) -> tuple[list[PromptParity], DistributionCheck | None]:
    """Each sample's row, and under probabilistic drafting the test over all of them."""
    rows, expected = [], []
    for s in samples:
        stored = split_tokens(client, s.path_id)[1]
        walk = walks[s.path_id]
        extra = {"seed": s.seed, "registered_prompt_id": s.path_id, "outside_support": walk.outside_support}
        if setting.draft_sampling == "greedy":
            row = compare_prompt(s.source, stored, s.output, walk.chain.round_taus, s.live, k)
            rows.append(row.model_copy(update=extra))
            continue
        if walk.probabilistic is None:
            raise ValueError(f"the offline walk of {s.path_id} gave no expectation under probabilistic drafting")
        expected.append(walk.probabilistic)
        rows.append(_expected_row(s, stored, walk.probabilistic).model_copy(update=extra))
    if setting.draft_sampling == "greedy":
        return rows, None
    lengths = [len(s.output) for s in samples]
    return rows, distribution_check([s.live for s in samples], lengths, expected)


def _expected_row(sample: LiveSample, stored: Sequence[int], expected: ExpectedRounds) -> PromptParity:
    """A sample's row under probabilistic drafting: judged with every round, unless the stored path is
    not the engine's output (then it differs outright)."""
    differs = first_difference(stored, sample.output)
    why = "in distribution: judged with every round (below)"
    if differs is not None:
        why = f"the stored path differs from the engine's output at position {differs}"
    return PromptParity(
        prompt_id=sample.source,
        response_tokens=len(stored),
        first_token_difference=differs,
        live_drafts=sample.live.drafts,
        live_accepted=sample.live.accepted,
        offline_rounds=None,
        offline_accepted=None,
        agrees=None if differs is None else False,
        why=why,
        expected=expected,
    )
