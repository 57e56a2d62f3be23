"""What an evaluation measures, beyond the checkpoint and the prompts: one model, validated the same
for `eval-worker evaluate`, `submit`, `watch` and `POST /jobs`."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from schemas.layers import CheckpointLayerConvention
from schemas.prompts import SetName
from schemas.sampling import DraftSampling
from schemas.trees import EagleTreeShape

MAX_TREE_BUDGET = 4096  # DDTree budgets above this are refused
MAX_STEPS = 64


def distinct(values: list[Any], what: str) -> None:
    """ValueError naming the values that occur more than once."""
    dupes = sorted(v for v, n in Counter(values).items() if n > 1)
    if dupes:
        raise ValueError(f"{what} must be distinct, got {dupes} more than once")


class EvalSpec(BaseModel):
    """Trees, chain length, layer reading and prompt sets of an evaluation; 0, negative and repeated
    values are refused with one message wherever they come from."""

    model_config = ConfigDict(extra="forbid")
    tree_budgets: list[StrictInt] = Field(default_factory=list, max_length=64, description="DFlash: DDTree budgets")
    target_layer_ids: list[StrictInt] | None = Field(default=None, min_length=1, max_length=256)
    block_size: StrictInt | None = Field(default=None, ge=2, le=1024, description="DFlash: draft block length")
    steps: StrictInt | None = Field(default=None, description="EAGLE-3: chain drafts per round")
    eagle_trees: list[str] = Field(default_factory=list, max_length=16, description='EAGLE-3: "TOPK,DEPTH,TOTAL"')
    layer_convention: CheckpointLayerConvention | None = Field(
        default=None, description="EAGLE-3: read the checkpoint's layer ids in this convention"
    )
    sets: list[SetName] = Field(default_factory=list, max_length=64, description="only these sets, reported per set")
    draft_sampling: DraftSampling = Field(
        default="greedy",
        description="greedy: the chain walk (vLLM's default drafting; exact on sampled responses too); "
        "probabilistic: also the expected tau under standard rejection sampling with sampled drafts",
    )

    @model_validator(mode="after")
    def _sets(self) -> EvalSpec:
        distinct(self.sets, "sets")
        return self

    @field_validator("eagle_trees")
    @classmethod
    def _eagle_trees(cls, v: list[str]) -> list[str]:
        keys = [EagleTreeShape.parse(t).key for t in v]  # ValueError names the bad one
        distinct(keys, "EAGLE trees")
        return keys

    @field_validator("tree_budgets")
    @classmethod
    def _budgets(cls, v: list[int]) -> list[int]:
        bad = [b for b in v if not 1 <= b <= MAX_TREE_BUDGET]
        if bad:
            raise ValueError(f"tree budgets must be in 1..{MAX_TREE_BUDGET}, got {bad}")
        distinct(v, "tree budgets")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_STEPS:
            raise ValueError(f"steps must be in 1..{MAX_STEPS}, got {v}")
        return v

    @field_validator("target_layer_ids")
    @classmethod
    def _layers(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if any(k < 0 for k in v):
                raise ValueError(f"target layer ids must be >= 0, got {v}")
            distinct(v, "target layer ids")
        return v
