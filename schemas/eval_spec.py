"""What an evaluation measures, beyond the checkpoint and the prompts: one model, validated the same
for `eval-worker evaluate`, `submit`, `watch` and `POST /jobs`, and carried whole to the walks.

The options one drafter family alone reads are that family's block, a union discriminated on `family`
(`family_options`); a spec without one drafts with the family's defaults. A block of another family
than the checkpoint's is refused when the checkpoint is loaded, never ignored. Bodies written before the
blocks existed (flat `tree_budgets`, `block_size`, `steps`, `eagle_trees`, `layer_convention`) are read
into the block they meant."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from schemas.layers import CheckpointLayerConvention
from schemas.prompts import SetName
from schemas.sampling import DraftSampling
from schemas.trees import EagleTreeShape

MAX_TREE_BUDGET = 4096  # DDTree budgets above this are refused
MAX_STEPS = 64
DrafterFamilyName = Literal["dflash", "eagle3", "mtp"]
FAMILY_TITLES: dict[str, str] = {"dflash": "DFlash", "eagle3": "EAGLE-3", "mtp": "MTP"}


def distinct(values: list[Any], what: str) -> None:
    """ValueError naming the values that occur more than once."""
    dupes = sorted(v for v, n in Counter(values).items() if n > 1)
    if dupes:
        raise ValueError(f"{what} must be distinct, got {dupes} more than once")


def _steps_in_range(v: int | None) -> int | None:
    if v is not None and not 1 <= v <= MAX_STEPS:
        raise ValueError(f"steps must be in 1..{MAX_STEPS}, got {v}")
    return v


class DFlashOptions(BaseModel):
    """DFlash: DDTree budgets, the block length to draft, the mask token for a config that names none."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["dflash"] = "dflash"
    tree_budgets: list[StrictInt] = Field(default_factory=list, max_length=64, description="DDTree budgets")
    block_size: StrictInt | None = Field(default=None, ge=2, le=1024, description="draft this block length")
    mask_token_id: StrictInt | None = Field(default=None, ge=0, description="for a config that names none")

    @field_validator("tree_budgets")
    @classmethod
    def _budgets(cls, v: list[int]) -> list[int]:
        bad = [b for b in v if not 1 <= b <= MAX_TREE_BUDGET]
        if bad:
            raise ValueError(f"tree budgets must be in 1..{MAX_TREE_BUDGET}, got {bad}")
        distinct(v, "tree budgets")
        return v

    @property
    def asks_trees(self) -> bool:
        """Whether these options walk trees (DDTree budgets): greedy responses only."""
        return bool(self.tree_budgets)


class Eagle3Options(BaseModel):
    """EAGLE-3: chain drafts per round, EAGLE's dynamic trees, the convention to read its layer ids in."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["eagle3"] = "eagle3"
    steps: StrictInt | None = Field(default=None, description="chain drafts per round")
    eagle_trees: list[str] = Field(default_factory=list, max_length=16, description='"TOPK,DEPTH,TOTAL"')
    layer_convention: CheckpointLayerConvention | None = Field(
        default=None, description="read the checkpoint's layer ids in this convention"
    )

    _steps = field_validator("steps")(_steps_in_range)

    @field_validator("eagle_trees")
    @classmethod
    def _eagle_trees(cls, v: list[str]) -> list[str]:
        keys = [EagleTreeShape.parse(t).key for t in v]  # ValueError names the bad one
        distinct(keys, "EAGLE trees")
        return keys

    @property
    def asks_trees(self) -> bool:
        """Whether these options walk trees (EAGLE's dynamic trees): greedy responses only."""
        return bool(self.eagle_trees)


class MtpOptions(BaseModel):
    """MTP heads: chain drafts per round (the MTP layers reused in turn, as vLLM runs them)."""

    model_config = ConfigDict(extra="forbid")
    family: Literal["mtp"] = "mtp"
    steps: StrictInt | None = Field(default=None, description="chain drafts per round")

    _steps = field_validator("steps")(_steps_in_range)

    @property
    def asks_trees(self) -> bool:
        """MTP drafts chains only."""
        return False


AnyFamilyOptions = DFlashOptions | Eagle3Options | MtpOptions  # a new family's block joins here
FamilyOptions = Annotated[AnyFamilyOptions, Field(discriminator="family")]
FAMILY_OPTIONS: dict[DrafterFamilyName, type[AnyFamilyOptions]] = {
    "dflash": DFlashOptions,
    "eagle3": Eagle3Options,
    "mtp": MtpOptions,
}


def families_reading(field: str) -> list[DrafterFamilyName]:
    """The families whose options block has `field` (`steps`: EAGLE-3 and MTP)."""
    return [name for name, block in FAMILY_OPTIONS.items() if field in block.model_fields and field != "family"]


# Flat fields of bodies written before the family blocks, and the block each belonged to.
LEGACY_FAMILY_FIELDS: dict[str, DrafterFamilyName] = {
    "tree_budgets": "dflash",
    "block_size": "dflash",
    "mask_token_id": "dflash",
    "steps": "eagle3",
    "eagle_trees": "eagle3",
    "layer_convention": "eagle3",
}


def _is_set(value: object) -> bool:
    return value is not None and value != []


def lift_legacy_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A body with flat family fields -> the same body with them in `family_options` (ValueError when they
    belong to two families, or beside a block)."""
    flat = {k: data[k] for k in LEGACY_FAMILY_FIELDS if k in data}
    if not flat:
        return data
    rest = {k: v for k, v in data.items() if k not in flat}
    given = {k: v for k, v in flat.items() if _is_set(v)}
    if not given:
        return rest
    families = sorted({LEGACY_FAMILY_FIELDS[k] for k in given})
    if len(families) > 1:
        raise ValueError(f"options {sorted(given)} belong to different drafter families ({', '.join(families)})")
    if rest.get("family_options") is not None:
        raise ValueError(f"give {sorted(given)} inside family_options, not beside it")
    return {**rest, "family_options": {"family": families[0], **given}}


class EvalSpec(BaseModel):
    """Layer reading, prompt sets, drafting mode, loading policy and the family's own options of an
    evaluation; 0, negative and repeated values are refused with one message wherever they come from."""

    model_config = ConfigDict(extra="forbid")
    target_layer_ids: list[StrictInt] | None = Field(
        default=None, min_length=1, max_length=256, description="for a checkpoint that names no layers"
    )
    sets: list[SetName] = Field(default_factory=list, max_length=64, description="only these sets, reported per set")
    draft_sampling: DraftSampling = Field(
        default="greedy",
        description="greedy: the chain walk (vLLM's default drafting; exact on sampled responses too); "
        "probabilistic: also the expected tau under standard rejection sampling with sampled drafts",
    )
    config: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="drafter config.json for a torch.save file without one (a job's: under --checkpoint-root)",
    )
    inert_config_keys: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="config keys to accept as not changing the drafter's math (recorded in the report)",
    )
    family_options: FamilyOptions | None = Field(
        default=None, description="the options of the checkpoint's family; None: the family's defaults"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        return lift_legacy_fields(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _distinct(self) -> EvalSpec:
        distinct(self.sets, "sets")
        distinct(self.inert_config_keys, "inert config keys")
        if any(not k for k in self.inert_config_keys):
            raise ValueError("inert config keys must not be empty strings")
        return self

    @field_validator("target_layer_ids")
    @classmethod
    def _layers(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if any(k < 0 for k in v):
                raise ValueError(f"target layer ids must be >= 0, got {v}")
            distinct(v, "target layer ids")
        return v

    @property
    def asks_trees(self) -> bool:
        """Whether the family's options walk trees, which only greedy responses have."""
        return self.family_options is not None and self.family_options.asks_trees

    @property
    def family(self) -> DrafterFamilyName | None:
        """The family the options are for (None: no family options given)."""
        return self.family_options.family if self.family_options is not None else None
