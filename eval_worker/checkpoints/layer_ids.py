"""Which target layers a drafter's fc reads, and where that answer came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from eval_worker.errors import CheckpointRefused
from schemas.layers import layer_list_problem

LayerIdsSource = Literal["checkpoint", "inferred", "override"]


@dataclass(frozen=True)
class ResolvedLayerIds:
    """The target layers a drafter reads, and where they came from."""

    ids: tuple[int, ...]
    source: LayerIdsSource


def default_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """DFlash's tap formula for `num_taps` taps of an `num_target_layers`-layer target."""
    if num_taps == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_taps - 1)) for i in range(num_taps)]


def resolve_layer_ids(
    *,
    checkpoint_ids: Sequence[int] | None,
    override: Sequence[int] | None,
    fc_shape: Sequence[int],
    hidden_size: int,
    num_target_layers: int,
) -> ResolvedLayerIds:
    """Checkpoint ids if present (an override must agree), else the override, else inferred from fc."""
    if len(fc_shape) != 2 or fc_shape[1] % hidden_size or fc_shape[1] == 0:
        raise CheckpointRefused(
            f"fc.weight has shape {list(fc_shape)}: its width is not a positive multiple of hidden size {hidden_size}"
        )
    num_taps = fc_shape[1] // hidden_size
    if checkpoint_ids is not None:
        if override is not None and list(override) != list(checkpoint_ids):
            raise CheckpointRefused(
                f"layer ids override {list(override)} contradicts the checkpoint's target_layer_ids "
                f"{list(checkpoint_ids)}"
            )
        resolved = ResolvedLayerIds(tuple(checkpoint_ids), "checkpoint")
    elif override is not None:
        resolved = ResolvedLayerIds(tuple(override), "override")
    else:
        resolved = ResolvedLayerIds(tuple(default_layer_ids(num_target_layers, num_taps)), "inferred")
    if len(resolved.ids) != num_taps:
        raise CheckpointRefused(
            f"fc.weight has shape {list(fc_shape)} = {num_taps} taps of hidden size {hidden_size}, but the "
            f"{resolved.source} target_layer_ids {list(resolved.ids)} name {len(resolved.ids)} layers "
            f"(expected fc.weight [{fc_shape[0]}, {len(resolved.ids) * hidden_size}])"
        )
    problem = layer_list_problem(resolved.ids, num_target_layers)
    if problem is not None:
        raise CheckpointRefused(
            f"target_layer_ids {list(resolved.ids)} ({resolved.source}) for a {num_target_layers}-layer "
            f"target: {problem}"
        )
    return resolved
