"""What the evaluator needs from a hidden-state cache: the `FeatureSource` protocol.

The cache server's `CacheClient` satisfies it; tests pass in-process fakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cache_server.client import HiddenResult, TargetHeads
from schemas.model import ModelInfo


class FeatureSource(Protocol):
    """The target's description, one prompt's features for a layer list, and the target's heads."""

    def model(self) -> ModelInfo: ...

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult: ...

    def heads(self) -> TargetHeads: ...
