"""The `GET /hidden?encoding=pieces` body: the stored compressed pieces of the rows asked for, for a
client that decodes them on its own cores (1.45x fewer bytes on the wire, no decoding on the server).

Layout: 8-byte little-endian header length, a JSON header, then the pieces' bytes back to back, then
the token ids (int64 little-endian). The header holds the same `__metadata__` as the safetensors
body, the element type, the shape, and one entry per piece: [layer index in the request, first row
in the range, rows, kind, byte offset after the header, byte length, skip, digests]. A "blosc" piece is
a Blosc 1 chunk whose decoded bytes from `skip` on hold the rows, and `digests` the xxh3-64 of each of
its blocks as the server read them (`block_digests.py`; empty from an array stored before them), which
the client checks before it decodes; a "raw" piece is the rows themselves (checked by the server).

From an FP8 store (header `storage: float8_e4m3fn`) the pieces hold FP8 bytes (one per element), and
the scales follow the token ids: float32 little-endian [layers, rows], at header `scales` (offset,
length); `dtype` is still the target's, what the client dequantizes to (`schemas.storage.dequantize`).
"""

from __future__ import annotations

import json
import struct
from typing import Any

ENCODING = "pieces"
MEDIA_TYPE = "application/x-hidden-state-pieces"
# (layer index, at, rows, kind, offset, nbytes, skip, digests)
Piece = tuple[int, int, int, str, int, int, int, list[int]]


def pieces_header(
    metadata: dict[str, str],
    dtype: str,
    rows: int,
    hidden_size: int,
    layers: int,
    pieces: list[Piece],
    token_ids: tuple[int, int],
    scales: tuple[int, int] | None = None,
) -> bytes:
    """The bytes before the pieces: length, then the JSON header; `scales` (offset, length) for an FP8
    store's body."""
    header: dict[str, Any] = {
        "__metadata__": metadata,
        "dtype": dtype,
        "rows": rows,
        "hidden_size": hidden_size,
        "layers": layers,
        "pieces": pieces,
        "token_ids": list(token_ids),
    }
    if scales is not None:
        header |= {"storage": "float8_e4m3fn", "scales": list(scales)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw


def read_pieces_header(body: memoryview) -> tuple[dict[str, Any], int]:
    """The JSON header and where the pieces start; ValueError for a body that is not this layout."""
    if len(body) < 8:
        raise ValueError("body shorter than a pieces header")
    (length,) = struct.unpack_from("<Q", body)
    if 8 + length > len(body):
        raise ValueError(f"pieces header length {length} exceeds the body ({len(body)} bytes)")
    return json.loads(bytes(body[8 : 8 + length])), 8 + length
