"""Evaluate drafter checkpoints over cached prompts: chain tau, and tree tau (DDTree budgets for
DFlash, EAGLE's dynamic trees for EAGLE-3).

Features and heads come from an injected `FeatureSource`; every check happens before any math. The
checkpoints of a sweep that read the same layers share one pass over the prompts: each prompt's
features are fetched once (or found resident in the `FeatureCache`) and walked by every checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from cache_server.torch_utils import dtype_name
from eval_worker.checkpoints.loading import LoadedCheckpoint, check_fits_target
from eval_worker.drafters.config import DrafterConfig
from eval_worker.drafters.eagle3 import Eagle3Drafter
from eval_worker.drafters.eagle3_config import Eagle3Config
from eval_worker.evaluation.checks import check_features, check_heads
from eval_worker.evaluation.eagle_walks import CHAIN as EAGLE_CHAIN
from eval_worker.evaluation.eagle_walks import walk_eagle_prompts
from eval_worker.evaluation.feature_cache import FeatureCache, Fetched
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.source import FeatureSource
from eval_worker.evaluation.walks import CHAIN, DraftCost, PromptFeatures, walk_prompts
from eval_worker.scoring.summary import by_set, round_taus, summarize_set
from schemas.eval_spec import EvalSpec
from schemas.model import ModelInfo
from schemas.report import EvalCost, EvalReport, EvalSeconds, EvalSummary, PromptEval, RoundTaus
from schemas.trees import EagleTreeShape

log = logging.getLogger(__name__)

_WHY = {
    "checkpoint": "checkpoint - its target_layer_ids",
    "default": "default - the EAGLE-3 taps (layer inputs 2, L//2, L-3), the checkpoint names no layers",
    "inferred": "inferred - DFlash tap formula on fc.weight's width, the checkpoint names no layers",
    "override": "override - given explicitly, the checkpoint names no layers",
}


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate: trees and chain length, where and in which dtype the drafter runs, batching, progress."""

    tree_budgets: tuple[int, ...] = ()  # DDTree budgets (DFlash)
    eagle_trees: tuple[EagleTreeShape, ...] = ()  # EAGLE trees (EAGLE-3)
    steps: int | None = None  # EAGLE-3 chain drafts per round (None: the checkpoint's, else 5)
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    group_tokens: int = 8192  # prompt tokens whose walks are drafted together (each block reads its own context)
    max_blocks: int = 64  # blocks per drafter forward
    progress: bool = True

    def __post_init__(self) -> None:  # checked as the CLI and POST /jobs check them (ValidationError)
        EvalSpec(tree_budgets=list(self.tree_budgets), steps=self.steps, eagle_trees=[t.key for t in self.eagle_trees])


@dataclass
class _Run:
    """One checkpoint being evaluated, and what it has cost so far."""

    checkpoint: LoadedCheckpoint
    prompt_ids: list[str]
    started: float
    sets: dict[str, Sequence[str]]  # set name -> its prompt ids, for the per-set summaries
    results: dict[str, PromptEval] = field(default_factory=dict)
    cost: DraftCost = field(default_factory=DraftCost)
    fetched_bytes: int = 0
    cache_hits: int = 0
    fetch_s: float = 0.0

    @property
    def is_eagle3(self) -> bool:
        return self.checkpoint.family == "eagle3"

    def steps(self, opts: EvalOptions) -> int:
        """EAGLE-3 chain drafts per round: the option, else the checkpoint's own, else 5."""
        cfg = self.checkpoint.config
        own = cfg.speculative_tokens if isinstance(cfg, Eagle3Config) else None
        return opts.steps or own or 5


def evaluate(
    source: FeatureSource,
    checkpoint: LoadedCheckpoint,
    prompt_ids: Sequence[str],
    *,
    heads_cache: HeadsCache,
    options: EvalOptions | None = None,
    features: FeatureCache | None = None,
) -> EvalReport:
    """The report of one checkpoint over `prompt_ids` (see `evaluate_many`)."""
    [report] = evaluate_many(
        source, [checkpoint], [prompt_ids], heads_cache=heads_cache, options=options, features=features
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
) -> list[EvalReport]:
    """One report per checkpoint, checkpoint i evaluated on `prompt_ids[i]`, with features and heads
    from `source` (features resident in `features` are not fetched again); with `set_members[i]`
    (set name -> its prompt ids), report i is also summarized per set.

    The drafters are moved to the options' device and dtype in place."""
    opts = options or EvalOptions()
    started = time.perf_counter()
    info = source.model()
    for checkpoint in checkpoints:
        check_fits_target(checkpoint, info)
    heads = heads_cache.get(source, info.fingerprint)
    check_heads(heads, info)
    embed, lm_head = (t.to(opts.device, opts.dtype) for t in heads.to_torch())
    cache = features if features is not None else FeatureCache(0)
    cache.use_target(info.fingerprint)
    sets = set_members if set_members is not None else [{} for _ in checkpoints]
    runs = [_Run(c, list(ids), started, dict(m)) for c, ids, m in zip(checkpoints, prompt_ids, sets, strict=True)]
    groups: dict[tuple[int, ...], list[_Run]] = {}
    for run in runs:
        run.checkpoint.drafter.to(opts.device, opts.dtype).eval()
        groups.setdefault(run.checkpoint.target_layer_ids, []).append(run)
    for layers, group in groups.items():
        _log_layers(info, layers, group)
        _evaluate_group(source, cache, list(layers), group, embed, lm_head, info.fingerprint, opts)
    return [_report(run, info, opts) for run in runs]


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


def _evaluate_group(
    source: FeatureSource,
    cache: FeatureCache,
    layers: list[int],
    group: list[_Run],
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    fingerprint: str,
    opts: EvalOptions,
) -> None:
    """One pass over the union of the group's prompts: fetch each once, walk it with every checkpoint."""
    wanted = [set(run.prompt_ids) for run in group]
    union = list(dict.fromkeys(p for run in group for p in run.prompt_ids))
    chunk: list[Fetched] = []
    tokens = 0
    fetched = cache.iterate(source, union, layers)
    for item in tqdm(fetched, total=len(union), desc="eval", unit="prompt", disable=not opts.progress):
        readers = [run for run, ids in zip(group, wanted, strict=True) if item.prompt_id in ids]
        for i, run in enumerate(readers):  # the first reader pays for the fetch; the rest find it resident
            if i == 0 and item.fetched_bytes:
                run.fetched_bytes += item.fetched_bytes
                run.fetch_s += item.wait_s
            else:
                run.cache_hits += 1
        chunk.append(item)
        tokens += len(item.features.token_ids)
        if tokens >= opts.group_tokens:
            _walk_chunk(chunk, group, wanted, embed, lm_head, fingerprint, opts)
            chunk, tokens = [], 0
    if chunk:
        _walk_chunk(chunk, group, wanted, embed, lm_head, fingerprint, opts)


def _walk_chunk(
    chunk: list[Fetched],
    group: list[_Run],
    wanted: list[set[str]],
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    fingerprint: str,
    opts: EvalOptions,
) -> None:
    top_k = max(opts.tree_budgets, default=1)
    # On the drafter's device and dtype once, for every checkpoint of the group.
    ready = {
        item.prompt_id: PromptFeatures(
            item.features.hidden.to(opts.device, opts.dtype),
            item.features.token_ids.tolist(),
            item.features.metadata.prompt_len,
        )
        for item in chunk
    }
    for run, ids in zip(group, wanted, strict=True):
        mine = [item for item in chunk if item.prompt_id in ids]
        for item in mine:
            check_features(item.features, item.prompt_id, fingerprint, run.checkpoint)
        prompts = [ready[item.prompt_id] for item in mine]
        if not prompts:
            continue
        drafter = run.checkpoint.drafter
        if isinstance(drafter, Eagle3Drafter):
            walked = walk_eagle_prompts(
                drafter, prompts, drafter.embed_tokens.weight if drafter.has_embed else embed,
                steps=run.steps(opts), trees=opts.eagle_trees, cost=run.cost, max_rounds=opts.max_blocks,
            )  # fmt: skip
            chains = [taus[EAGLE_CHAIN] for taus in walked]
            eagle = [{t.key: round_taus(taus[t.key]) for t in opts.eagle_trees} for taus in walked]
            ddtrees: list[dict[int, RoundTaus]] = [{} for _ in walked]
        else:
            dflash = walk_prompts(
                drafter, prompts, embed, lm_head,
                tree_budgets=opts.tree_budgets, top_k=top_k, cost=run.cost, max_blocks=opts.max_blocks,
            )  # fmt: skip
            chains = [taus[CHAIN] for taus in dflash]
            ddtrees = [{b: round_taus(taus[b]) for b in opts.tree_budgets} for taus in dflash]
            eagle = [{} for _ in dflash]
        for i, (item, prompt) in enumerate(zip(mine, prompts, strict=True)):
            run.results[item.prompt_id] = PromptEval(
                prompt_id=item.prompt_id,
                prompt_len=prompt.prompt_len,
                num_tokens=len(prompt.token_ids),
                chain=round_taus(chains[i]),
                trees=ddtrees[i],
                eagle_trees=eagle[i],
                greedy_mismatches=item.features.metadata.greedy_mismatches,
                generator=item.features.metadata.generator,
            )


def _report(run: _Run, info: ModelInfo, opts: EvalOptions) -> EvalReport:
    checkpoint = run.checkpoint
    results = [run.results[p] for p in run.prompt_ids]
    not_greedy = [r.prompt_id for r in results if r.greedy_mismatches]
    if not_greedy:
        log.warning(
            "%d prompts have responses that are not the target's greedy continuation (e.g. %s): their tau "
            "measures acceptance against the given response, not what the live greedy loop would see",
            len(not_greedy),
            not_greedy[:3],
        )
    cost = EvalCost(
        drafted_blocks=run.cost.drafted_blocks,
        lm_head_rows=run.cost.lm_head_rows,
        feature_bytes_fetched=run.fetched_bytes,
        feature_cache_hits=run.cache_hits,
        seconds=EvalSeconds(fetch=run.fetch_s, draft=run.cost.draft_s, walk=run.cost.walk_s),
    )
    eagle3 = run.is_eagle3
    budgets = [] if eagle3 else list(opts.tree_budgets)
    eagle_trees = [t.key for t in opts.eagle_trees] if eagle3 else []
    summary = EvalSummary(
        **dict(summarize_set(results, budgets, eagle_trees)),
        by_set=by_set(results, run.sets, budgets, eagle_trees),
        prompts_not_target_greedy=len(not_greedy),
        generators=dict(Counter(r.generator or "unknown" for r in results)),
        wall_time_s=time.perf_counter() - run.started,
        cost=cost,
    )
    log.info("%s: chain tau %s over %d prompts", checkpoint.path, summary.chain.mean_tau, len(results))
    cfg, ids = checkpoint.config, checkpoint.layer_ids
    return EvalReport(
        checkpoint_path=str(checkpoint.path),
        format=checkpoint.format,
        drafter_family=checkpoint.family,
        layout=checkpoint.layout,
        step=checkpoint.step,
        epoch=checkpoint.epoch,
        target_name=info.name,
        target_fingerprint=info.fingerprint,
        target_layer_ids=list(ids.ids),
        layer_ids_source=ids.source,
        checkpoint_layer_ids=list(ids.checkpoint_ids) if ids.checkpoint_ids is not None else None,
        checkpoint_layer_convention=ids.convention,
        layer_convention_source=ids.convention_source,
        block_size=cfg.block_size if isinstance(cfg, DrafterConfig) else None,
        mask_token_id=cfg.mask_token_id if isinstance(cfg, DrafterConfig) else None,
        steps=run.steps(opts) if eagle3 else None,
        draft_vocab_size=cfg.draft_vocab_size if isinstance(cfg, Eagle3Config) else None,
        tree_budgets=budgets,
        eagle_trees=eagle_trees,
        device=str(opts.device),
        dtype=dtype_name(opts.dtype),
        prompts=results,
        summary=summary,
    )
