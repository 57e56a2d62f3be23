"""How a response is sampled from the target: the parameters users serve with (vLLM's names), and
how offline acceptance at T > 0 drafts. Temperature 0 is greedy; every other filter then is inert."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

# `draft_sample_method` as vLLM names it: the drafter's argmax (its probability taken as one), or a
# token sampled from the drafter's distribution at the same temperature.
DraftSampling = Literal["greedy", "probabilistic"]
DRAFT_SAMPLING: tuple[DraftSampling, ...] = ("greedy", "probabilistic")
MAX_SAMPLES = 1024
GREEDY_SETTING = "T=0"


def _format(x: float) -> str:
    return f"{x:g}"


class SamplingParams(BaseModel):
    """The target's sampling at one setting, with the seed of one sample (None: greedy, no seed).

    Filters apply as vLLM applies them to the target's logits: temperature first, then min-p, top-k,
    top-p. `top_k` 0 and `top_p` 1 and `min_p` 0 are off."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    temperature: float = Field(default=0.0, ge=0, le=100, description="0: greedy (argmax)")
    top_p: float = Field(default=1.0, gt=0, le=1, description="nucleus: the smallest set with this much mass")
    top_k: StrictInt = Field(default=0, ge=0, description="the k most likely tokens (0: off)")
    min_p: float = Field(default=0.0, ge=0, le=1, description="tokens at least min_p times the most likely one")
    seed: StrictInt | None = Field(default=None, ge=0, lt=2**63, description="this sample's seed (None: greedy)")

    @field_validator("temperature", "top_p", "min_p")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _greedy_has_no_seed(self) -> SamplingParams:
        if self.greedy and self.seed is not None:
            raise ValueError("temperature 0 is greedy: a seed means nothing there")
        return self

    @property
    def greedy(self) -> bool:
        """Whether this is the argmax (temperature 0)."""
        return self.temperature == 0

    @property
    def setting(self) -> str:
        """The setting without the seed, as reports group by it: `T=0`, `T=0.6 top_p=0.95 top_k=20`."""
        if self.greedy:
            return GREEDY_SETTING
        parts = [f"T={_format(self.temperature)}"]
        if self.top_p < 1:
            parts.append(f"top_p={_format(self.top_p)}")
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.min_p:
            parts.append(f"min_p={_format(self.min_p)}")
        return " ".join(parts)

    def describe(self) -> str:
        """One line: the setting and, when sampled, the seed."""
        return self.setting if self.seed is None else f"{self.setting} seed={self.seed}"


GREEDY = SamplingParams()


def setting_temperature(setting: str) -> float:
    """The temperature of a `SamplingParams.setting` string (`T=0.6 top_p=0.95` -> 0.6)."""
    head = setting.split(" ", 1)[0]
    if not head.startswith("T="):
        raise ValueError(f"not a sampling setting: {setting!r}")
    return float(head[2:])


def trees_problem(trees: bool, settings: Collection[str]) -> str | None:
    """Why trees cannot be measured on prompts whose responses have these sampling settings, or None.
    Tree acceptance is walked on greedy (T = 0) responses only; asked of prompts that are all sampled,
    it is refused rather than reported empty."""
    if trees and settings and GREEDY_SETTING not in settings:
        return (
            f"trees at T > 0 are not measured: these prompts' responses are sampled at {sorted(settings)}; "
            "ask for the chain only (no tree budgets or EAGLE trees), or include T = 0 prompts"
        )
    return None
