"""A drafter checkpoint loaded for a target, whatever its family, and what a user may supply beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from torch import nn

from eval_worker.checkpoints.layer_ids import LayerIdsSource, ResolvedLayerIds
from eval_worker.checkpoints.raw import CheckpointFormat
from eval_worker.errors import CheckpointRefused
from schemas.eval_spec import FAMILY_TITLES, AnyFamilyOptions, DrafterFamilyName, FamilyOptions

Family = DrafterFamilyName
Options = TypeVar("Options", bound=AnyFamilyOptions)


@dataclass(frozen=True)
class LoadRequest:
    """What a user supplies beside a checkpoint: layer ids (decoder outputs) for one that names none,
    the family's own options (`EvalSpec.family_options`: a DFlash block length or mask token, the
    convention to read EAGLE-3 ids in, ...; a block of another family is refused before loading), and
    config keys to accept as inert."""

    layer_ids: tuple[int, ...] | None = None
    options: FamilyOptions | None = None
    inert_config_keys: frozenset[str] = frozenset()


def requested_options(request: LoadRequest, kind: type[Options]) -> Options:
    """The request's block of `kind`'s family, else that family's defaults (CheckpointRefused for another
    family's block, which the caller refuses first)."""
    options = request.options or kind()
    if not isinstance(options, kind):
        title = FAMILY_TITLES[kind().family]
        raise CheckpointRefused(f"{options.family} options apply to {options.family} checkpoints, not {title}")
    return options


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A drafter loaded strictly for a target, with its family, layout and where its layer ids came from."""

    path: Path
    format: CheckpointFormat
    family: Family
    layout: str  # "dflash", or the EAGLE-3 layout: "eagle" | "specforge" | "speculators"
    config: object  # the family's own config class: only its folder reads it
    drafter: nn.Module  # the family's drafter, reading the concatenated taps
    layer_ids: ResolvedLayerIds
    step: int | None
    epoch: int | None
    tap_width: int  # one target layer's features as the drafter reads them (the target's hidden size)
    options: FamilyOptions  # the family's options the walks read (the request's, else the family's defaults)
    inert_config_keys: tuple[str, ...] = ()  # config keys present and accepted as inert by request
    warnings: tuple[str, ...] = ()  # what loading accepted but a reader should know (in the report)

    def options_as(self, kind: type[Options]) -> Options:
        """The options its loader resolved, as its family's block."""
        assert isinstance(self.options, kind)
        return self.options

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """The target layers fetched, as the cache serves them (0-based decoder outputs)."""
        return self.layer_ids.ids

    @property
    def layer_ids_source(self) -> LayerIdsSource:
        """Where those ids came from."""
        return self.layer_ids.source
