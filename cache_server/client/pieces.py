"""Decoding a `GET /hidden?encoding=pieces` body on the client's cores into the same array the
safetensors body carries. numcodecs (Blosc) is imported only here, when a body is decoded.

Each piece decodes into its thread's reused buffer and is copied once into its rows and columns of
the result: decoding into fresh memory per piece would page-fault on every call."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from cache_server.client.body_reader import Scratch
from schemas.block_digests import check_piece
from schemas.fp8 import dequantize
from schemas.pieces import read_pieces_header
from schemas.safetensors_frame import numpy_dtype
from schemas.storage import STORAGE_NAMES

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_decoded = Scratch()  # per decode thread
_BLOCK_SLACK = 64 << 20  # a piece cut to whole Blosc blocks decodes at most this much beyond its rows


def _decode_pool() -> ThreadPoolExecutor:
    """One pool for the process (Blosc releases the GIL: pieces decode in parallel), so its threads'
    buffers are reused from call to call."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="pieces-decode")
        return _pool


class PiecesCorrupt(ValueError):
    """A piece's blocks do not match the digests the server read them with: damaged since."""


class OutMismatch(ValueError):
    """A caller's `out` array does not fit the body (the caller's error, not the server's)."""


def check_out(out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """OutMismatch unless `out` is C-contiguous with this shape and dtype."""
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise OutMismatch(
            f"out must be a C-contiguous {dtype} array of shape {list(shape)}, got {out.dtype} {list(out.shape)}"
        )


def _checked_blosc_size(src: memoryview, piece: list[Any], need: int, where: str) -> int:
    """The size a Blosc piece decodes to, once its digests (from a server that sends them) match
    (PiecesCorrupt else) and its header's size fits the `need` bytes its rows take (ValueError else)."""
    if len(piece) > 7 and piece[7]:
        try:
            check_piece(src, piece[7], where)
        except ValueError as e:
            raise PiecesCorrupt(str(e)) from e
    size = int.from_bytes(src[4:8], "little")  # a Blosc 1 header's nbytes
    if not need <= size <= need + _BLOCK_SLACK:
        raise ValueError(f"{where} decodes to {size} bytes; its rows need {need}")
    return size


def decode_pieces(
    body: np.ndarray | bytes, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """(hidden [rows, layers * H], token_ids [rows] int64, metadata) of a pieces body, hidden written into
    `out` when given (C-contiguous, that shape and dtype); ValueError on a malformed one or a wrong `out`,
    PiecesCorrupt (before anything is decoded from it) on a piece that fails its checksums."""
    from numcodecs import blosc  # the one heavy import of the client, only for this path

    view = memoryview(body.data if isinstance(body, np.ndarray) else body).cast("B")
    header, data = read_pieces_header(view)
    rows, h, dtype = int(header["rows"]), int(header["hidden_size"]), numpy_dtype(header["dtype"])
    layers = int(header["layers"])
    shape = (rows, layers * h)
    hidden = np.empty(shape, dtype) if out is None else out
    check_out(hidden, shape, dtype)
    storage = header.get("storage", "exact")
    if storage not in STORAGE_NAMES:
        raise ValueError(f"pieces body of an unknown storage {storage!r}")
    fp8 = storage == "float8_e4m3fn"
    stored = np.empty((rows, layers * h), np.uint8) if fp8 else hidden  # FP8 bytes, dequantized below
    row_bytes = h * stored.dtype.itemsize

    def one(piece: list[Any]) -> None:
        i, at, n, offset, nbytes, skip = (int(piece[k]) for k in (0, 1, 2, 4, 5, 6))
        src = view[data + offset : data + offset + nbytes]
        if len(src) != nbytes:
            raise ValueError(f"piece of layer {i} at row {at} runs past the body")
        decoded: memoryview | np.ndarray = src
        if piece[3] != "raw":
            size = _checked_blosc_size(src, piece, skip + n * row_bytes, f"piece of layer {i} at row {at}")
            decoded = _decoded(size)
            blosc.decompress(src, decoded)
        rows_bytes = np.frombuffer(decoded, np.uint8, n * row_bytes, skip)
        stored[at : at + n, i * h : (i + 1) * h] = rows_bytes.view(stored.dtype).reshape(n, h)

    list(_decode_pool().map(one, header["pieces"]))
    lo, n = header["token_ids"]
    token_ids = np.frombuffer(view[data + lo : data + lo + n], "<i8").astype(np.int64)
    if fp8:
        at, nbytes = (int(v) for v in header["scales"])
        if nbytes != layers * rows * 4 or data + at + nbytes > len(view):
            raise ValueError(f"scales of {nbytes} bytes at {at} do not fit [{layers}, {rows}] in the body")
        scales = np.frombuffer(view[data + at : data + at + nbytes], "<f4").reshape(layers, rows)

        def dequantized(i: int) -> None:
            dequantize(stored[:, i * h : (i + 1) * h], scales[i], hidden[:, i * h : (i + 1) * h])

        list(_decode_pool().map(dequantized, range(layers)))
    return hidden, token_ids, header["__metadata__"]
