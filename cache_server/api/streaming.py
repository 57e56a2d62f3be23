"""`GET /hidden` as a stream: the safetensors header first (every size is known up front), then the
hidden rows in blocks, each sent as soon as it is decoded while the next block decodes, then the
token ids (the header and the ids travel in the first and last block's buffer). The bytes are exactly
`bodies.hidden_body`'s; only their timing changes.

Blocks follow the store's chunks (1024 rows), so no chunk is decoded twice. Their buffers are reused
once the transport has let go of them: uvloop keeps a reference to a buffer it has not finished
writing, and overwriting it then would corrupt the response (measured), so a buffer is taken again
only when nothing but the pool refers to it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from cache_server.api.bodies import hidden_metadata
from cache_server.store import chunks
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.hidden import HIDDEN_TENSOR, TOKEN_IDS_TENSOR, LayerRequest
from schemas.safetensors_frame import TensorSpec, frame_header, numpy_dtype

AHEAD = 2  # blocks decoded ahead of the one being sent


class BlockBuffers:
    """Byte buffers for row blocks, handed out again only when no one else holds them."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of at least `nbytes` (its first `nbytes` bytes), reused when one is idle."""
        with self._lock:
            for i, buf in enumerate(self._free):
                # 3 references: the list, `buf`, and getrefcount's argument. More: a transport still holds it.
                if buf.nbytes >= nbytes and sys.getrefcount(buf) <= 3:
                    return self._free.pop(i)[:nbytes]
        return np.empty(nbytes, np.uint8)

    def give_back(self, buf: np.ndarray) -> None:
        """Offer a sent buffer for reuse (it is taken again only once the transport lets go)."""
        base = buf.base if isinstance(buf.base, np.ndarray) else buf
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(base)


@dataclass(frozen=True)
class HiddenStream:
    """The body's length and its pieces, in order."""

    nbytes: int
    pieces: AsyncIterator[bytes | memoryview]


def row_blocks(start: int, stop: int, rows: int | None = None) -> list[tuple[int, int]]:
    """[start, stop) cut at multiples of `rows` (default: the store's chunk boundaries)."""
    rows = rows or chunks.CHUNK_TOKENS
    cuts = [start, *range((start // rows + 1) * rows, stop, rows), stop]
    return list(itertools.pairwise(cuts))


async def hidden_stream(
    store: HiddenStore,
    manifest: PromptManifest,
    layers: Sequence[int],
    start: int,
    stop: int,
    pool: ThreadPoolExecutor,
    buffers: BlockBuffers,
    asked: LayerRequest | None = None,
) -> HiddenStream:
    """The stream of a `/hidden` body. The first block is decoded before this returns, so that a
    store error still becomes an error response; a later one aborts the connection (the client sees
    a body shorter than its Content-Length, never wrong bytes)."""
    width = len(layers) * manifest.hidden_size
    dtype = numpy_dtype(manifest.dtype)
    specs = [
        TensorSpec(HIDDEN_TENSOR, dtype, (stop - start, width)),
        TensorSpec(TOKEN_IDS_TENSOR, np.dtype(np.int64), (stop - start,)),
    ]
    head, offsets = frame_header(specs, hidden_metadata(manifest, layers, start, stop, asked).to_strings())
    row_bytes = width * dtype.itemsize
    ids = await asyncio.wrap_future(pool.submit(store.token_ids, manifest.prompt_id))  # zarr: off the loop
    token_ids = np.ascontiguousarray(ids[start:stop], dtype="<i8").tobytes()

    def decode(lo: int, hi: int) -> np.ndarray:
        # The header rides with the first block and the token ids with the last: every write is a
        # large one (a small write between large ones can wait out a delayed ACK).
        before, after = head if lo == start else b"", token_ids if hi == stop else b""
        buf = buffers.take(len(before) + (hi - lo) * row_bytes + len(after))
        rows = buf[len(before) : len(before) + (hi - lo) * row_bytes]
        store.read_into(manifest.prompt_id, layers, rows.view(store.numpy_dtype).reshape(hi - lo, width), lo, hi)
        buf[: len(before)] = np.frombuffer(before, np.uint8)
        buf[len(buf) - len(after) :] = np.frombuffer(after, np.uint8)
        return buf

    blocks = deque(row_blocks(start, stop))
    decoding: deque[Future[np.ndarray]] = deque()
    while blocks and len(decoding) < 1 + AHEAD:
        decoding.append(pool.submit(decode, *blocks.popleft()))
    first = await asyncio.wrap_future(decoding.popleft())

    async def pieces() -> AsyncIterator[bytes | memoryview]:
        block: np.ndarray | None = first
        try:
            while block is not None:
                if blocks:
                    decoding.append(pool.submit(decode, *blocks.popleft()))
                yield memoryview(block.data)
                buffers.give_back(block)
                block = None
                if decoding:
                    block = await asyncio.wrap_future(decoding.popleft())
        finally:
            for future in decoding:  # a client that left: let the rest finish, keep nothing
                future.cancel()

    return HiddenStream(len(head) + offsets[TOKEN_IDS_TENSOR][1], pieces())
