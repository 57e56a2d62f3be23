"""The manifest of one published prompt, and the store's errors.

Errors:

    StoreError              base of everything raised here
    ├── StoreInputError     arguments that can never succeed (shape, dtype, range, id, token mismatch)
    ├── PromptNotStored     no published prompt with this id
    ├── LayersNotStored     the published prompt lacks some requested layers
    └── StoreCorrupt        a published prompt whose files don't match its manifest
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from schemas.dtypes import DTypeName
from schemas.layers import LAYER_CONVENTION, LayerConvention


class StoreError(Exception):
    """Base of the hidden-state store's errors."""


class StoreInputError(StoreError):
    """The arguments can never succeed: bad shape, dtype, range or id, or token ids that differ."""


class PromptNotStored(StoreError):
    """No published prompt has this id."""


class LayersNotStored(StoreError):
    """The published prompt does not hold some of the requested layers."""

    def __init__(self, prompt_id: str, missing: Sequence[int]) -> None:
        self.prompt_id = prompt_id
        self.missing = tuple(missing)
        super().__init__(f"prompt {prompt_id!r} has no stored layers {list(self.missing)}")


class StoreCorrupt(StoreError):
    """A published prompt whose files don't match its manifest."""


class PromptManifest(BaseModel):
    """What one published prompt holds; written last, so its presence means the data is complete."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prompt_id: str
    model_fingerprint: str
    model_name: str
    dtype: DTypeName
    layer_convention: LayerConvention = LAYER_CONVENTION
    layers: tuple[int, ...]
    prompt_len: int
    num_tokens: int
    hidden_size: int
    token_sha256: str
    codec: str
    created_at: str
    # Response tokens that are not the target's argmax under the stored forward (None: not checked).
    # 0 means the response is the target's own greedy continuation, so offline tau equals the live
    # greedy loop's; a given (not generated) response usually differs.
    greedy_mismatches: int | None = None


def token_sha256(token_ids: np.ndarray) -> str:
    """sha256 of the int64 little-endian token id bytes."""
    return hashlib.sha256(np.ascontiguousarray(token_ids, dtype="<i8").tobytes()).hexdigest()
