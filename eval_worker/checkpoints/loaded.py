"""A drafter checkpoint loaded for a target, whatever its family, and what a user may supply beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torch import nn

from eval_worker.checkpoints.layer_ids import LayerConvention, LayerIdsSource, ResolvedLayerIds
from eval_worker.checkpoints.raw import CheckpointFormat

Family = Literal["dflash", "eagle3"]


@dataclass(frozen=True)
class LoadRequest:
    """What a user supplies beside a checkpoint: layer ids (decoder outputs) for one that names none,
    a DFlash block length to draft instead of the config's, the convention to read EAGLE-3 ids in, a
    DFlash mask token for a config that names none. A family refuses what does not apply to it."""

    layer_ids: tuple[int, ...] | None = None
    block_size: int | None = None
    layer_convention: LayerConvention | None = None
    mask_token_id: int | None = None


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A drafter loaded strictly for a target, with its family, layout and where its layer ids came from."""

    path: Path
    format: CheckpointFormat
    family: Family
    layout: str  # "dflash", or the EAGLE-3 layout: "eagle" | "specforge" | "speculators"
    config: object  # the family's own config class: only its folder reads it
    drafter: nn.Module  # the family's drafter, with an `fc` over the concatenated taps
    layer_ids: ResolvedLayerIds
    step: int | None
    epoch: int | None
    tap_width: int  # one target layer's features as the drafter reads them (the target's hidden size)

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """The target layers fetched, as the cache serves them (0-based decoder outputs)."""
        return self.layer_ids.ids

    @property
    def layer_ids_source(self) -> LayerIdsSource:
        """Where those ids came from."""
        return self.layer_ids.source
