"""`eval-worker inspect`: what a checkpoint is and which target layers it needs, without evaluating."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eval_worker.checkpoints.loaded import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.checkpoints.raw import read_raw
from eval_worker.families import family_of

if TYPE_CHECKING:
    from cache_server.client import CacheClient


def describe_checkpoint(
    path: Path, *, config_path: Path | None = None, mask_token_id: int | None = None, client: CacheClient | None = None
) -> str:
    """What `eval-worker inspect` prints; with a `client`, also the layers it would fetch from its target."""
    raw = read_raw(path, config_path)
    lines = family_of(raw.config).describe(path, raw, LoadRequest(mask_token_id=mask_token_id))
    if client is not None:
        info = client.model()
        ckpt = load_checkpoint(
            path, info, config_path=config_path, mask_token_id=mask_token_id
        )  # raises CheckpointRefused if unfit
        lines.append(
            f"against {info.name:<10} layers {list(ckpt.target_layer_ids)} ({ckpt.layer_ids_source}); loads strictly"
        )
    return "\n".join(lines)
