"""One evaluation against a cache server: load the checkpoint for its target, pick the prompts,
score them. Shared by `eval-worker evaluate` and the job worker."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cache_server.client import CacheClient
from cache_server.devices import resolve_device
from cache_server.dtypes import TORCH_DTYPES
from eval_worker.checkpoint import load_checkpoint
from eval_worker.evaluate import EvalOptions, evaluate
from eval_worker.heads_cache import HeadsCache
from eval_worker.settings import WorkerSettings
from schemas.prompts import PromptStatus
from schemas.report import EvalReport

log = logging.getLogger(__name__)


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


def run_evaluation(
    client: CacheClient,
    checkpoint: Path,
    settings: WorkerSettings,
    *,
    prompt_ids: Sequence[str] | None = None,
    tree_budgets: Sequence[int] = (),
    layer_ids: Sequence[int] | None = None,
    block_size: int | None = None,
    config_path: Path | None = None,
    progress: bool = True,
) -> EvalReport:
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
