"""Evaluate a drafter checkpoint over cached prompts: chain tau and DDTree tau per budget.

`evaluate` scores a loaded checkpoint with features from an injected `FeatureSource`; every layout
check happens before any math, and a mismatch stops the run with a typed error rather than
producing a number. `evaluate_checkpoint` is the whole run against a cache server: load the
checkpoint for its target, pick and wait for the prompts, evaluate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from cache_server.client import CacheClient, HiddenResult, TargetHeads
from cache_server.torch_utils import TORCH_DTYPES, dtype_name, resolve_device
from eval_worker.checkpoints.loading import LoadedCheckpoint, check_fits_target, load_checkpoint
from eval_worker.drafters.batched import draft_anchors
from eval_worker.errors import CheckpointRefused, FeatureMismatch
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.source import FeatureSource
from eval_worker.scoring.acceptance import DraftLookup, chain_round_taus, tree_round_taus
from eval_worker.scoring.summary import round_taus, summarize
from eval_worker.settings import EvaluateSettings
from schemas.layers import LAYER_CONVENTION
from schemas.model import ModelInfo
from schemas.prompts import PromptStatus
from schemas.report import EvalReport, EvalSummary, PromptEval

log = logging.getLogger(__name__)

_WHY = {
    "checkpoint": "checkpoint - its target_layer_ids",
    "inferred": "inferred - DFlash tap formula on fc.weight's width, the checkpoint names no layers",
    "override": "override - given explicitly, the checkpoint names no layers",
}


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate: tree budgets, where and in which dtype the drafter runs, batching, progress."""

    tree_budgets: tuple[int, ...] = ()
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    chunk_size: int = 16  # anchors per batched drafter pass (memory ~ chunk * (B-1) * vocab floats)
    progress: bool = True


def score_prompt(
    prompt_id: str,
    drafts: DraftLookup,
    token_ids: Sequence[int],
    prompt_len: int,
    block_size: int,
    tree_budgets: Sequence[int],
) -> PromptEval:
    """Chain and per-budget tree round taus of one prompt from its per-anchor drafts."""
    return PromptEval(
        prompt_id=prompt_id,
        prompt_len=prompt_len,
        num_tokens=len(token_ids),
        chain=round_taus(chain_round_taus(token_ids, prompt_len, block_size, drafts)),
        trees={b: round_taus(tree_round_taus(token_ids, prompt_len, block_size, drafts, b)) for b in tree_budgets},
    )


def evaluate(
    source: FeatureSource,
    checkpoint: LoadedCheckpoint,
    prompt_ids: Sequence[str],
    *,
    heads_cache: HeadsCache,
    options: EvalOptions | None = None,
) -> EvalReport:
    """The report of `checkpoint` over `prompt_ids`, with features and heads from `source`.

    The checkpoint's drafter is moved to the options' device and dtype in place."""
    opts = options or EvalOptions()
    started = time.perf_counter()
    info = source.model()
    check_fits_target(checkpoint, info)
    extra = [k for k in checkpoint.target_layer_ids if k not in info.capture_layers]
    if extra:
        log.info(
            "layers %s are not in the cache's capture set %s; the server computes them",
            extra,
            info.capture_layers,
        )
    heads = heads_cache.get(source, info.fingerprint)
    _check_heads(heads, info)
    layers = list(checkpoint.target_layer_ids)
    log.info(
        "requesting target layers %s for %d prompts (source: %s)",
        layers,
        len(prompt_ids),
        _WHY[checkpoint.layer_ids_source],
    )
    embed, lm_head = (t.to(opts.device, opts.dtype) for t in heads.to_torch())
    drafter = checkpoint.drafter.to(opts.device, opts.dtype).eval()
    block_size = checkpoint.config.block_size
    top_k = max(opts.tree_budgets, default=1)
    results = []
    for prompt_id in tqdm(prompt_ids, desc="eval", unit="prompt", disable=not opts.progress):
        res = source.hidden(prompt_id, layers)
        _check_hidden(res, prompt_id, layers, heads.fingerprint, checkpoint)
        hidden, token_ids = res.to_torch()
        prompt_len, total = res.metadata.prompt_len, int(token_ids.shape[0])
        drafts = draft_anchors(
            drafter,
            hidden.to(opts.device, opts.dtype),
            token_ids.to(opts.device),
            range(prompt_len, max(prompt_len, total - 1)),
            embed,
            lm_head,
            top_k=top_k,
            chunk_size=opts.chunk_size,
        )
        scored = score_prompt(prompt_id, drafts, token_ids.tolist(), prompt_len, block_size, opts.tree_budgets)
        results.append(scored.model_copy(update={"greedy_mismatches": res.metadata.greedy_mismatches}))
    not_greedy = [r.prompt_id for r in results if r.greedy_mismatches]
    if not_greedy:
        log.warning(
            "%d prompts have responses that are not the target's greedy continuation (e.g. %s): their tau "
            "measures acceptance against the given response, not what the live greedy loop would see",
            len(not_greedy),
            not_greedy[:3],
        )
    summary = EvalSummary(
        chain=summarize([r.chain for r in results]),
        trees={b: summarize([r.trees[b] for r in results]) for b in opts.tree_budgets},
        prompts_evaluated=len(results),
        prompts_not_target_greedy=len(not_greedy),
        wall_time_s=time.perf_counter() - started,
    )
    log.info("chain tau %s over %d prompts", summary.chain.mean_tau, len(results))
    return EvalReport(
        checkpoint_path=str(checkpoint.path),
        format=checkpoint.format,
        step=checkpoint.step,
        epoch=checkpoint.epoch,
        target_name=info.name,
        target_fingerprint=info.fingerprint,
        target_layer_ids=layers,
        layer_ids_source=checkpoint.layer_ids_source,
        block_size=block_size,
        mask_token_id=checkpoint.config.mask_token_id,
        tree_budgets=list(opts.tree_budgets),
        device=str(opts.device),
        dtype=dtype_name(opts.dtype),
        prompts=results,
        summary=summary,
    )


def _check_heads(heads: TargetHeads, info: ModelInfo) -> None:
    want = (info.vocab_size, info.hidden_size)
    for name, tensor in (("embed_tokens", heads.embed_tokens), ("lm_head", heads.lm_head)):
        if tuple(tensor.shape) != want:
            raise FeatureMismatch(f"target {name} has shape {list(tensor.shape)}, the model says {list(want)}")


def _check_hidden(
    res: HiddenResult, prompt_id: str, layers: list[int], fingerprint: str, checkpoint: LoadedCheckpoint
) -> None:
    meta = res.metadata
    fc_width = checkpoint.drafter.fc.weight.shape[1]
    if res.hidden.ndim != 2 or res.hidden.shape[1] != fc_width:
        raise CheckpointRefused(
            f"prompt {prompt_id}: served features have shape {list(res.hidden.shape)}, but fc.weight "
            f"{list(checkpoint.drafter.fc.weight.shape)} needs width {fc_width} for layers {layers}"
        )
    if meta.layers != layers:
        raise FeatureMismatch(f"prompt {prompt_id}: requested layers {layers}, the cache served {meta.layers}")
    if meta.model_fingerprint != fingerprint:
        raise FeatureMismatch(
            f"prompt {prompt_id}: features are from target {meta.model_fingerprint!r}, heads from {fingerprint!r}"
        )
    if meta.layer_convention != LAYER_CONVENTION:
        raise FeatureMismatch(f"prompt {prompt_id}: layer convention {meta.layer_convention!r} != {LAYER_CONVENTION!r}")
    if meta.hidden_size != checkpoint.config.hidden_size:
        raise FeatureMismatch(
            f"prompt {prompt_id}: features have hidden size {meta.hidden_size}, the drafter "
            f"{checkpoint.config.hidden_size}"
        )
    total = res.token_ids.shape[0]
    if res.hidden.shape[0] != total or meta.start != 0 or meta.stop != total:
        raise FeatureMismatch(
            f"prompt {prompt_id}: need the whole sequence; got hidden rows {res.hidden.shape[0]}, "
            f"{total} token ids, span [{meta.start}, {meta.stop})"
        )
    if not 1 <= meta.prompt_len <= total:
        raise FeatureMismatch(f"prompt {prompt_id}: prompt_len {meta.prompt_len} outside [1, {total}]")


def select_prompts(client: CacheClient, prompt_ids: Sequence[str] | None, timeout_s: float) -> list[str]:
    """The given ids, or every registered prompt that has not failed; waits until they are ready."""
    if prompt_ids is None:
        states = client.prompts()
        failed = [s.prompt_id for s in states if s.status == PromptStatus.failed]
        if failed:
            log.warning("skipping %d prompts the target failed on: %s", len(failed), failed[:5])
        prompt_ids = [s.prompt_id for s in states if s.status != PromptStatus.failed]
    if not prompt_ids:
        raise ValueError("no prompts to evaluate: register some with POST /prompts first")
    client.wait_ready(prompt_ids, timeout_s=timeout_s)
    return list(prompt_ids)


def evaluate_checkpoint(
    client: CacheClient,
    checkpoint: Path,
    settings: EvaluateSettings,
    *,
    prompt_ids: Sequence[str] | None = None,
    tree_budgets: Sequence[int] = (),
    layer_ids: Sequence[int] | None = None,
    block_size: int | None = None,
    config_path: Path | None = None,
    progress: bool = True,
) -> EvalReport:
    """Load `checkpoint` strictly for the server's target and evaluate it on `prompt_ids` (None: all)."""
    info = client.model()
    ckpt = load_checkpoint(
        checkpoint, info, config_path=config_path, layer_ids_override=layer_ids, block_size_override=block_size
    )
    ids = select_prompts(client, prompt_ids, settings.timeout_s)
    options = EvalOptions(
        tree_budgets=tuple(tree_budgets),
        device=str(resolve_device(settings.device)),
        dtype=TORCH_DTYPES[settings.dtype],
        progress=progress,
    )
    return evaluate(client, ckpt, ids, heads_cache=HeadsCache(settings.heads_cache), options=options)
