"""`eval-worker inspect`: what a checkpoint is and which target layers it needs, without evaluating."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eval_worker.checkpoints.loading import check_options, detect, load_detected, request_of
from schemas.eval_spec import EvalSpec

if TYPE_CHECKING:
    from cache_server.client import CacheClient


def describe_checkpoint(path: Path, spec: EvalSpec | None = None, *, client: CacheClient | None = None) -> str:
    """What `eval-worker inspect` prints (`spec`: its config file, options and inert keys, as `evaluate`
    reads them); with a `client`, also the layers it would fetch from its target."""
    spec = spec or EvalSpec()
    raw, family = detect(path, Path(spec.config) if spec.config is not None else None)
    request = request_of(spec)
    check_options(path, family, request)
    lines = family.describe(path, raw, request)
    if client is not None:
        info = client.model()
        ckpt = load_detected(path, raw, family, info, request)  # raises CheckpointRefused if unfit
        lines.append(
            f"against {info.name:<10} layers {list(ckpt.target_layer_ids)} ({ckpt.layer_ids_source}); loads strictly"
        )
    return "\n".join(lines)
