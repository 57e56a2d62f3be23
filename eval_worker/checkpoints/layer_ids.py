"""Which target layers a drafter's fc reads, and where that answer came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from eval_worker.errors import CheckpointRefused
from schemas.choices import one_of
from schemas.layers import CHECKPOINT_LAYER_CONVENTIONS, CheckpointLayerConvention, layer_list_problem

LayerIdsSource = Literal["checkpoint", "default", "inferred", "override", "family"]
LayerConvention = CheckpointLayerConvention
ConventionSource = Literal["layout", "override"]


@dataclass(frozen=True)
class ResolvedLayerIds:
    """The target layers a drafter reads (the cache's convention: 0-based decoder outputs), where they came
    from, and the ids as the checkpoint wrote them with the convention they were read in."""

    ids: tuple[int, ...]
    source: LayerIdsSource
    checkpoint_ids: tuple[int, ...] | None = None
    convention: LayerConvention = "decoder_output_0based"
    convention_source: ConventionSource = "layout"


def eagle3_default_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default taps, layer inputs (2, L//2, L-3), as decoder outputs [1, L//2 - 1, L - 4]."""
    n = num_target_layers
    return (1, n // 2 - 1, n - 4)


def to_decoder_outputs(ids: Sequence[int], convention: LayerConvention) -> tuple[int, ...]:
    """Ids written in `convention` as the cache's decoder-output ids (layer input i = decoder output i-1);
    ValueError for a convention that is neither."""
    if one_of(convention, CHECKPOINT_LAYER_CONVENTIONS, "layer_convention") == "decoder_output_0based":
        return tuple(ids)
    if 0 in ids:
        raise CheckpointRefused(
            f"layer ids {list(ids)} in the layer-input convention include 0, the embeddings, which are not a "
            "decoder layer's output and are not cached; if these ids are decoder outputs, pass "
            "--layer-convention decoder_output_0based"
        )
    return tuple(i - 1 for i in ids)


def resolve_eagle3_layer_ids(
    *,
    checkpoint_ids: Sequence[int] | None,
    layout_convention: LayerConvention,
    convention_override: LayerConvention | None,
    override: Sequence[int] | None,
    fc_width: int,
    target_hidden_size: int,
    num_target_layers: int,
) -> ResolvedLayerIds:
    """An EAGLE-3 checkpoint's ids in the cache's convention: its own (read in the layout's convention or
    the override's), else `override` (already decoder outputs), else the EAGLE-3 defaults."""
    convention = convention_override or layout_convention
    how: ConventionSource = "override" if convention_override else "layout"
    if checkpoint_ids is not None:
        ids = to_decoder_outputs(checkpoint_ids, convention)
        if override is not None and tuple(override) != ids:
            raise CheckpointRefused(
                f"layer ids override {list(override)} contradicts the checkpoint's ids {list(checkpoint_ids)} "
                f"({convention}) = decoder outputs {list(ids)}"
            )
        resolved = ResolvedLayerIds(ids, "checkpoint", tuple(checkpoint_ids), convention, how)
    elif override is not None:
        resolved = ResolvedLayerIds(tuple(override), "override", None, convention, how)
    else:
        resolved = ResolvedLayerIds(eagle3_default_layer_ids(num_target_layers), "default", None, convention, how)
    n = len(resolved.ids)
    if fc_width != n * target_hidden_size:
        raise CheckpointRefused(
            f"fc.weight reads {fc_width} features, but the {resolved.source} layer ids {list(resolved.ids)} name "
            f"{n} layers of target hidden size {target_hidden_size}: fc width must be {n} x {target_hidden_size} "
            f"= {n * target_hidden_size}"
        )
    return _fitting(resolved, num_target_layers, f"decoder outputs; {resolved.source}, read as {convention}")


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
        resolved = ResolvedLayerIds(tuple(checkpoint_ids), "checkpoint", tuple(checkpoint_ids))
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
    return _fitting(resolved, num_target_layers, resolved.source)


def _fitting(resolved: ResolvedLayerIds, num_target_layers: int, how: str) -> ResolvedLayerIds:
    """`resolved`, unless its ids are not distinct layers of the target."""
    problem = layer_list_problem(resolved.ids, num_target_layers)
    if problem is not None:
        raise CheckpointRefused(
            f"target layer ids {list(resolved.ids)} ({how}) for a {num_target_layers}-layer target: {problem}"
        )
    return resolved
