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

    def model(self) -> ModelInfo:
        """The target the features come from."""
        ...

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        """One prompt's features of `layers`, concatenated per token in that order."""
        ...

    def heads(self) -> TargetHeads:
        """The target's embed_tokens and lm_head."""
        ...
