"""The `GET /hidden?encoding=pieces` body (`schemas/pieces.py`): the stored pieces as they are.

The body is sent as its parts (header, each piece, token ids), never joined: joining would copy
every byte once more into a fresh buffer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cache_server.api.bodies import hidden_metadata
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.hidden import LayerRequest
from schemas.pieces import Piece, pieces_header


@dataclass(frozen=True)
class PiecesBody:
    """A pieces body as the buffers to send in order, and their total length."""

    parts: list[memoryview | bytes]
    nbytes: int

    def joined(self) -> bytes:
        """The whole body in one buffer (for tests and in-process readers)."""
        return b"".join(self.parts)


def pieces_body(
    store: HiddenStore,
    manifest: PromptManifest,
    layers: Sequence[int],
    start: int,
    stop: int,
    asked: LayerRequest | None = None,
) -> PiecesBody:
    """Rows start:stop of `layers` as stored (blocks the rows need), with the token ids."""
    index: list[Piece] = []
    payloads: list[memoryview] = []
    offset = 0
    for i, layer_pieces in enumerate(store.encoded(manifest.prompt_id, layers, start, stop)):
        for at, rows, kind, payload, skip, digests in layer_pieces:
            index.append((i, at, rows, kind, offset, len(payload), skip, list(digests)))
            payloads.append(payload)
            offset += len(payload)
    token_ids = np.ascontiguousarray(store.token_ids(manifest.prompt_id)[start:stop], dtype="<i8").tobytes()
    scales, scales_at = b"", None
    if manifest.storage != "exact":
        scales = np.ascontiguousarray(store.scales(manifest.prompt_id, layers, start, stop), dtype="<f4").tobytes()
        scales_at = (offset + len(token_ids), len(scales))
    metadata = hidden_metadata(manifest, layers, start, stop, asked).to_strings()
    head = pieces_header(
        metadata,
        manifest.dtype,
        stop - start,
        manifest.hidden_size,
        len(layers),
        index,
        (offset, len(token_ids)),
        scales_at,
    )
    return PiecesBody([head, *payloads, token_ids, scales], len(head) + offset + len(token_ids) + len(scales))
