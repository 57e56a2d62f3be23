"""What the evaluator needs from a hidden-state cache: the `FeatureSource` protocol and its results.

The cache-server HTTP client satisfies the protocol; tests pass in-process fakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from schemas.hidden import HiddenResult, TargetHeads
from schemas.model import ModelInfo


class FeatureSource(Protocol):
    def model(self) -> ModelInfo: ...

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult: ...

    def heads(self) -> TargetHeads: ...


__all__ = ["FeatureSource", "HiddenResult", "TargetHeads"]
