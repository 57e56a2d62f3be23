"""The hidden-state store's errors.

Errors:

    StoreError              base of everything the store raises
    ├── StoreInputError     arguments that can never succeed (shape, dtype, range, id, token mismatch)
    ├── PromptNotStored     no published prompt with this id
    ├── LayersNotStored     the published prompt lacks some requested layers
    └── StoreCorrupt        a published prompt whose files don't match its manifest
"""

from __future__ import annotations

from collections.abc import Sequence


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
    """A published prompt whose files don't match its manifest; `layers`: the layers whose files are
    bad, when only they are (the prompt's token ids and manifest are sound)."""

    def __init__(self, message: str, layers: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.layers = tuple(layers)
