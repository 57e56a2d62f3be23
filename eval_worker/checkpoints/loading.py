"""Load drafter checkpoints - strictly, or not at all - whatever their family (the table in
`families/` tells them apart by their config and loads each its own way): anything that would not load with
`strict=True` into a drafter fitting the target raises `CheckpointRefused` naming the tensor, the
shapes and the layer ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval_worker.checkpoints.layer_ids import LayerConvention
from eval_worker.checkpoints.loaded import LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import read_raw
from eval_worker.errors import CheckpointRefused
from eval_worker.families import FAMILIES, family_of
from schemas.layers import layer_list_problem
from schemas.model import ModelInfo


def load_checkpoint(
    path: Path,
    target: ModelInfo,
    *,
    config_path: Path | None = None,
    layer_ids_override: Sequence[int] | None = None,
    block_size_override: int | None = None,
    layer_convention: LayerConvention | None = None,
    mask_token_id: int | None = None,
) -> LoadedCheckpoint:
    """A drafter that fits `target`, loaded strictly from `path` (a HF dir or a torch.save file).

    `layer_ids_override` (decoder outputs) is only for checkpoints that name no layers (one that
    contradicts them is refused); `block_size_override` drafts a different DFlash block length than
    the config's; `layer_convention` reads an EAGLE-3 checkpoint's ids in that convention;
    `mask_token_id` is for DFlash configs that name none."""
    raw = read_raw(path, config_path)
    ids = tuple(layer_ids_override) if layer_ids_override is not None else None
    request = LoadRequest(ids, block_size_override, layer_convention, mask_token_id)
    return family_of(raw.config).load(path, raw, target, request)


def check_fits_target(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """Re-check a loaded checkpoint against a (possibly different) target description."""
    FAMILIES[checkpoint.family].check_fits(checkpoint, target)
    problem = layer_list_problem(checkpoint.target_layer_ids, target.num_layers)
    if problem is not None:
        raise CheckpointRefused(
            f"target_layer_ids {list(checkpoint.target_layer_ids)} for target {target.name!r}: {problem}"
        )
