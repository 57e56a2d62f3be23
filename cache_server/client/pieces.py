"""Decoding a `GET /hidden?encoding=pieces` body on the client's cores into the same array the
safetensors body carries. numcodecs (Blosc) is imported only here, when a body is decoded."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from schemas.pieces import read_pieces_header
from schemas.safetensors_frame import numpy_dtype


def decode_pieces(body: np.ndarray | bytes) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """(hidden [rows, layers * H], token_ids [rows] int64, metadata) of a pieces body; ValueError on a
    malformed one."""
    from numcodecs import blosc  # the one heavy import of the client, only for this path

    view = memoryview(body.data if isinstance(body, np.ndarray) else body).cast("B")
    header, data = read_pieces_header(view)
    rows, h, dtype = int(header["rows"]), int(header["hidden_size"]), numpy_dtype(header["dtype"])
    hidden = np.empty((rows, int(header["layers"]) * h), dtype)
    row_bytes = h * dtype.itemsize

    def one(piece: list[object]) -> None:
        i, at, n, kind, offset, nbytes, skip = piece
        src = view[data + int(offset) : data + int(offset) + int(nbytes)]  # type: ignore[call-overload]
        if len(src) != nbytes:
            raise ValueError(f"piece of layer {i} at row {at} runs past the body")
        decoded = src if kind == "raw" else memoryview(blosc.decompress(src))
        rows_bytes = np.frombuffer(decoded, np.uint8, int(n) * row_bytes, int(skip))  # type: ignore[call-overload]
        hidden[int(at) : int(at) + int(n), int(i) * h : (int(i) + 1) * h] = rows_bytes.view(dtype).reshape(int(n), h)  # type: ignore[call-overload]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(one, header["pieces"]))  # Blosc releases the GIL: pieces decode in parallel
    lo, n = header["token_ids"]
    token_ids = np.frombuffer(view[data + lo : data + lo + n], "<i8").astype(np.int64)
    return hidden, token_ids, header["__metadata__"]
