"""The `GET /hidden?encoding=pieces` body (`schemas/pieces.py`): the stored pieces as they are."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.pieces import Piece, pieces_header


def pieces_body(
    store: HiddenStore, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int, metadata: dict[str, str]
) -> bytes:
    """Rows start:stop of `layers` as stored (blocks the rows need), with the token ids."""
    index: list[Piece] = []
    payloads: list[bytes] = []
    offset = 0
    for i, layer_pieces in enumerate(store.encoded(manifest.prompt_id, layers, start, stop)):
        for at, rows, kind, payload, skip in layer_pieces:
            index.append((i, at, rows, kind, offset, len(payload), skip))
            payloads.append(payload)
            offset += len(payload)
    token_ids = np.ascontiguousarray(store.token_ids(manifest.prompt_id)[start:stop], dtype="<i8").tobytes()
    head = pieces_header(metadata, manifest.dtype, stop - start, manifest.hidden_size, len(layers), index,
                         (offset, len(token_ids)))  # fmt: skip
    return b"".join([head, *payloads, token_ids])
