"""How many threads torch gives the drafter math on CPU, chosen once when a command that walks drafters
starts. A drafter's matrices are small (a block of a few tokens times the hidden size): with several
intra-op threads each op waits on the slowest of them, and when other work holds a core that wait
dominates (one 2,228-token DFlash prompt on 2 busy cores: 280 s with torch's default, 14 s with one
thread). One thread is the default; on a GPU the setting does nothing."""

from __future__ import annotations

import logging
import os

import torch

from cache_server.torch_utils import resolve_device
from eval_worker.settings import EvaluateSettings

log = logging.getLogger(__name__)


def cpu_threads(settings: EvaluateSettings, environ: dict[str, str] | None = None) -> int | None:
    """The intra-op threads to set: `--threads` when given (0: torch's default, one per core), else one,
    unless OMP_NUM_THREADS is set (torch follows it already: None, nothing to set)."""
    env = os.environ if environ is None else environ
    if settings.threads is not None:
        return settings.threads or None
    return None if env.get("OMP_NUM_THREADS") else 1


def use_cpu_threads(settings: EvaluateSettings) -> None:
    """Set torch's intra-op threads as `cpu_threads` says when the drafter runs on the CPU."""
    if resolve_device(settings.device).type != "cpu":
        return
    threads = cpu_threads(settings)
    if threads is not None:
        torch.set_num_threads(threads)
    log.debug("drafter math on %d CPU thread(s)", torch.get_num_threads())
