"""Evaluate drafter checkpoints over cached prompts: chain tau, tree tau (DDTree budgets for DFlash,
EAGLE's dynamic trees for EAGLE-3) on greedy responses, and under probabilistic drafting the expected
tau of every response (`prompt_walks.py`).

Features and heads come from an injected `FeatureSource`; every check happens before any math. The
checkpoints of a sweep that read the same layers share one pass over the prompts: each prompt's
features are fetched once (or found resident in the `FeatureCache`) and walked by every checkpoint.
The walk counts into a `WalkProgress` (prompts walked, rounds, ETA) that the `eval` bar shows.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from cache_server.torch_utils import dtype_name
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.checkpoints.loading import check_fits_target
from eval_worker.evaluation.checks import check_features, check_heads
from eval_worker.evaluation.feature_cache import FeatureCache, Fetched
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.progress import WalkProgress
from eval_worker.evaluation.prompt_walks import fetch_layers, serve_prompt, walk_checkpoint
from eval_worker.evaluation.responses import rounds_warnings
from eval_worker.evaluation.source import FeatureSource
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost
from eval_worker.families import FAMILIES
from eval_worker.reports.conventions import chain_line
from eval_worker.scoring.summary import by_set, summarize_set
from schemas.model import ModelInfo
from schemas.report import EvalCost, EvalReport, EvalSeconds, EvalSummary, PromptEval
from schemas.storage import describe_storage

log = logging.getLogger(__name__)

_WHY = {
    "checkpoint": "checkpoint - its target_layer_ids",
    "default": "default - the EAGLE-3 taps (layer inputs 2, L//2, L-3), the checkpoint names no layers",
    "inferred": "inferred - DFlash tap formula on fc.weight's width, the checkpoint names no layers",
    "override": "override - given explicitly, the checkpoint names no layers",
    "family": "family - the layers the family's drafters always read",
}


@dataclass
class _Run:
    """One checkpoint being evaluated, and what it has cost so far."""

    index: int  # in the evaluation's checkpoints: its counters in the `WalkProgress`
    checkpoint: LoadedCheckpoint
    prompt_ids: list[str]
    started: float
    sets: dict[str, Sequence[str]]  # set name -> its prompt ids, for the per-set summaries
    cost: DraftCost
    results: dict[str, PromptEval] = field(default_factory=dict)
    fetched_bytes: int = 0
    cache_hits: int = 0
    fetch_s: float = 0.0


def evaluate(
    source: FeatureSource,
    checkpoint: LoadedCheckpoint,
    prompt_ids: Sequence[str],
    *,
    heads_cache: HeadsCache,
    options: EvalOptions | None = None,
    features: FeatureCache | None = None,
    progress: WalkProgress | None = None,
) -> EvalReport:
    """The report of one checkpoint over `prompt_ids` (see `evaluate_many`)."""
    [report] = evaluate_many(
        source,
        [checkpoint],
        [prompt_ids],
        heads_cache=heads_cache,
        options=options,
        features=features,
        progress=progress,
    )
    return report


def evaluate_many(
    source: FeatureSource,
    checkpoints: Sequence[LoadedCheckpoint],
    prompt_ids: Sequence[Sequence[str]],
    *,
    heads_cache: HeadsCache,
    options: EvalOptions | None = None,
    features: FeatureCache | None = None,
    set_members: Sequence[Mapping[str, Sequence[str]]] | None = None,
    progress: WalkProgress | None = None,
) -> list[EvalReport]:
    """One report per checkpoint, checkpoint i evaluated on `prompt_ids[i]`, with features and heads
    from `source` (features resident in `features` are not fetched again); with `set_members[i]`
    (set name -> its prompt ids), report i is also summarized per set. The walk counts into
    `progress` (checkpoint i's counters: i); WalkStopped when a checkpoint's walk is stopped there.

    The drafters are moved to the options' device and dtype in place."""
    opts = options or EvalOptions()
    started = time.perf_counter()
    info = source.model()
    for checkpoint in checkpoints:
        check_fits_target(checkpoint, info)
    served = heads_cache.get(source, info.fingerprint)
    check_heads(served, info)
    heads = DeviceHeads.of(served, opts)
    cache = features if features is not None else FeatureCache(0)
    cache.use_target(info.fingerprint)
    sets = set_members if set_members is not None else [{} for _ in checkpoints]
    walk = progress if progress is not None else WalkProgress()
    runs = [
        _Run(i, c, list(ids), started, dict(m), DraftCost(watch=functools.partial(walk.drafted, i)))
        for i, (c, ids, m) in enumerate(zip(checkpoints, prompt_ids, sets, strict=True))
    ]
    groups: dict[tuple[int, ...], list[_Run]] = {}
    for run in runs:
        run.checkpoint.drafter.to(opts.device, opts.dtype).eval()
        groups.setdefault(run.checkpoint.target_layer_ids, []).append(run)
    walk.start([len(run.prompt_ids) for run in runs])
    with _bar(walk, opts):
        for layers, group in groups.items():
            _log_layers(info, layers, group)
            _evaluate_group(source, cache, group, _Pass(list(layers), heads, info, opts, walk))
    return [_report(run, info, opts) for run in runs]


@contextlib.contextmanager
def _bar(walk: WalkProgress, opts: EvalOptions) -> Iterator[None]:
    """The `eval` bar while `walk` runs: prompts walked of all (every checkpoint's), rounds so far."""
    total = walk.overall().prompts_total
    with tqdm(total=total, desc="eval", unit="prompt", disable=not opts.progress) as bar:

        def show() -> None:
            now = walk.overall()
            bar.n = now.prompts_walked
            bar.set_postfix_str(f"{now.rounds} rounds", refresh=False)
            bar.update(0)  # redraws at most every mininterval

        walk.listeners.append(show)
        try:
            yield
        finally:
            walk.listeners.remove(show)


def _log_layers(info: ModelInfo, layers: tuple[int, ...], group: list[_Run]) -> None:
    extra = [k for k in layers if k not in info.capture_layers]
    if extra:
        log.info(
            "layers %s are not in the cache's capture set %s; the server computes them", extra, info.capture_layers
        )
    for run in group:
        path, why = run.checkpoint.path, _WHY[run.checkpoint.layer_ids_source]
        log.info(
            "%s: requesting target layers %s for %d prompts (source: %s)", path, list(layers), len(run.prompt_ids), why
        )


@dataclass(frozen=True)
class _Pass:
    """What one pass over a group's prompts walks with: the layers the group reads, the target's heads
    and description, the options, and the progress it counts into."""

    layers: list[int]
    heads: DeviceHeads
    info: ModelInfo
    opts: EvalOptions
    walk: WalkProgress


def _evaluate_group(source: FeatureSource, cache: FeatureCache, group: list[_Run], p: _Pass) -> None:
    """One pass over the union of the group's prompts: fetch each once, walk it with every checkpoint."""
    wanted = [set(run.prompt_ids) for run in group]
    union = list(dict.fromkeys(pid for run in group for pid in run.prompt_ids))
    chunk: list[Fetched] = []
    tokens = 0
    # closed at once when a walk is stopped, ending the fetches ahead
    with contextlib.closing(cache.iterate(source, union, fetch_layers(p.layers, p.info.num_layers, p.opts))) as items:
        for item in items:
            readers = [run for run, ids in zip(group, wanted, strict=True) if item.prompt_id in ids]
            for i, run in enumerate(readers):  # the first reader pays for the fetch; the rest find it resident
                if i == 0 and item.fetched_bytes:
                    run.fetched_bytes += item.fetched_bytes
                    run.fetch_s += item.wait_s
                else:
                    run.cache_hits += 1
            chunk.append(item)
            tokens += len(item.features.token_ids)
            if tokens >= p.opts.group_tokens:
                _walk_chunk(chunk, group, wanted, p)
                chunk, tokens = [], 0
    if chunk:
        _walk_chunk(chunk, group, wanted, p)


def _walk_chunk(chunk: list[Fetched], group: list[_Run], wanted: list[set[str]], p: _Pass) -> None:
    # The drafter's taps apart from the target's last layer (fetched too for probabilistic drafting),
    # on the drafter's device and dtype once, for every checkpoint of the group.
    last = p.info.num_layers - 1
    served = {item.prompt_id: serve_prompt(item.prompt_id, item.features, p.layers, last, p.opts) for item in chunk}
    for run, ids in zip(group, wanted, strict=True):
        mine = [served[item.prompt_id] for item in chunk if item.prompt_id in ids]
        for s in mine:
            check_features(s.features, s.prompt_id, p.info.fingerprint, run.checkpoint)
        if mine:
            run.results |= walk_checkpoint(run.checkpoint, mine, p.heads, p.opts, run.cost)
            p.walk.walked(run.index, len(mine))


def _warn_unlike_the_target(prompt_ids: list[str], what: str) -> None:
    if prompt_ids:
        log.warning("%d prompts " + what, len(prompt_ids), prompt_ids[:3])


def _report(run: _Run, info: ModelInfo, opts: EvalOptions) -> EvalReport:
    checkpoint = run.checkpoint
    results = [run.results[p] for p in run.prompt_ids]
    not_greedy = [r.prompt_id for r in results if r.greedy_mismatches]
    _warn_unlike_the_target(
        not_greedy,
        "have responses that are not the target's greedy continuation (e.g. %s): their tau measures "
        "acceptance against the given response, not what the live greedy loop would see",
    )
    _warn_unlike_the_target(
        [r.prompt_id for r in results if r.outside_support],
        "are sampled responses with tokens the target would never sample at their setting (e.g. %s): "
        "another model made them, and their tau is not the live loop's",
    )
    cost = EvalCost(
        drafted_blocks=run.cost.drafted_blocks,
        lm_head_rows=run.cost.lm_head_rows,
        feature_bytes_fetched=run.fetched_bytes,
        feature_cache_hits=run.cache_hits,
        seconds=EvalSeconds(fetch=run.fetch_s, draft=run.cost.draft_s, walk=run.cost.walk_s),
    )
    # the trees walked, in the options' order: every greedy prompt has each (sampled ones have none)
    budgets = list(dict.fromkeys(b for r in results for b in r.trees))
    shapes = list(dict.fromkeys(k for r in results for k in r.eagle_trees))
    summary = EvalSummary(
        **dict(summarize_set(results, budgets, shapes)),
        by_set=by_set(results, run.sets, budgets, shapes),
        prompts_not_target_greedy=len(not_greedy),
        generators=dict(Counter(r.generator or "unknown" for r in results)),
        captures=dict(Counter(r.capture or "unknown" for r in results)),
        wall_time_s=time.perf_counter() - run.started,
        cost=cost,
    )
    log.info("%s: chain tau over %d prompts: %s", checkpoint.path, len(results), chain_line(summary))
    found = rounds_warnings(results, run.sets)
    for line in found:
        log.warning("%s: %s", checkpoint.path, line)
    ids = checkpoint.layer_ids
    return EvalReport(
        checkpoint_path=str(checkpoint.path),
        format=checkpoint.format,
        drafter_family=checkpoint.family,
        layout=checkpoint.layout,
        step=checkpoint.step,
        epoch=checkpoint.epoch,
        target_name=info.name,
        target_fingerprint=info.fingerprint,
        feature_storage=describe_storage(info.storage),
        target_layer_ids=list(ids.ids),
        layer_ids_source=ids.source,
        checkpoint_layer_ids=list(ids.checkpoint_ids) if ids.checkpoint_ids is not None else None,
        checkpoint_layer_convention=ids.convention,
        layer_convention_source=ids.convention_source,
        drafting=FAMILIES[checkpoint.family].report_fields(checkpoint),
        draft_sampling=["greedy", "probabilistic"] if opts.draft_sampling == "probabilistic" else ["greedy"],
        inert_config_keys=list(checkpoint.inert_config_keys),
        warnings=[*checkpoint.warnings, *found],
        device=str(opts.device),
        dtype=dtype_name(opts.dtype),
        prompts=results,
        summary=summary,
    )
