"""Bit rot never reaches a reader: a byte flipped anywhere in a stored chunk (header, block table, any
block) fails every read that touches it, whole or a row range, decoded by the store or sent as pieces,
and reads that do not touch it still return the exact bytes. A piece damaged after the server read it
fails the client's check before it is decoded. Arrays written before block digests keep working."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from cache_server.api.pieces_body import pieces_body
from cache_server.client.pieces import PiecesCorrupt, decode_pieces
from cache_server.store import chunks as arrays
from cache_server.store.errors import StoreCorrupt
from cache_server.store.hidden_store import HiddenStore
from schemas.block_digests import HEADER, BloscHeader, block_spans, head_end
from schemas.storage import StorageName

WIDTH, ROWS, CHUNK_ROWS, BLOCK = 64, 150, 64, 4096  # 3 chunks; bf16: 2 blocks a chunk, fp32/FP8 bytes: 4 or 1


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "CHUNK_TOKENS", CHUNK_ROWS)
    monkeypatch.setattr(arrays, "BLOSC_BLOCKSIZE", BLOCK)


@pytest.fixture
def store_of(store_root: str, small_blocks: None) -> Iterator[functools.partial[HiddenStore]]:
    opened: list[HiddenStore] = []

    def _open(dtype: torch.dtype, storage: StorageName) -> HiddenStore:
        name = f"rot-{storage}"
        store = HiddenStore(
            store_root, fingerprint=name, model_name="t", hidden_size=WIDTH, dtype=dtype, storage=storage
        )
        opened.append(store)
        return store

    yield functools.partial(_open)
    for store in opened:
        store.close()


def _layer(dtype: torch.dtype, noise: bool = False) -> torch.Tensor:
    """Activation-like values, or (`noise`) random bf16 bit patterns, which Blosc stores as is (MEMCPYED)."""
    g = torch.Generator().manual_seed(3)
    if noise:
        return torch.randint(-(2**15), 2**15, (ROWS, WIDTH), generator=g, dtype=torch.int16).view(torch.bfloat16)
    return (torch.randn(ROWS, WIDTH, generator=g) * torch.linspace(0.1, 4, WIDTH)).to(dtype)


def _flips(chunk: bytes) -> list[tuple[int, str]]:
    """Offsets to damage, each with the region it is in: every header byte, the block table's first and
    last, and the first, middle and last byte of every block."""
    end = head_end(BloscHeader.of(chunk))
    found = [(i, "head") for i in sorted({*range(HEADER.size), min(HEADER.size, end - 1), end - 1})]
    for k, (a, b) in enumerate(block_spans(chunk)):
        found += [(a, f"block {k}"), ((a + b) // 2, f"block {k}"), (b - 1, f"block {k}")]
    return found


def _ranges(chunk: int, blocks: int) -> list[tuple[int, int]]:
    """The whole prompt, the inside of each block of the damaged chunk that holds rows, another chunk."""
    per_block, first = CHUNK_ROWS // blocks, chunk * CHUNK_ROWS
    inside = [(first + k * per_block + 1, min(first + (k + 1) * per_block - 1, ROWS)) for k in range(blocks)]
    other = (chunk + 1) % 3 * CHUNK_ROWS
    return [(0, ROWS), *(r for r in inside if r[0] < r[1]), (other, other + 5)]


def _touches(start: int, stop: int, chunk: int, region: str, blocks: int) -> bool:
    """Whether rows start:stop need the damaged region (the head: any row of the chunk)."""
    per_block, first = CHUNK_ROWS // blocks, chunk * CHUNK_ROWS
    k = None if region == "head" else int(region.split()[1])
    lo, hi = (first, first + CHUNK_ROWS) if k is None else (first + k * per_block, first + (k + 1) * per_block)
    return max(start, lo) < min(stop, hi, ROWS)


def _read_both_ways(store: HiddenStore, manifest: object, start: int, stop: int) -> list[np.ndarray]:
    out = np.empty((stop - start, WIDTH), store.numpy_dtype)
    store.read_into("p", [0], out, start, stop)
    hidden, _, _ = decode_pieces(pieces_body(store, manifest, [0], start, stop).joined())  # type: ignore[arg-type]
    return [out.view(np.uint8), hidden.view(np.uint8)]


@pytest.mark.parametrize(
    ("dtype", "storage", "noise"),
    [
        (torch.bfloat16, "exact", False),
        (torch.float32, "exact", False),
        (torch.bfloat16, "float8_e4m3fn", False),
        (torch.bfloat16, "exact", True),
    ],
    ids=["bf16", "fp32", "fp8", "bf16-stored-as-is"],
)
def test_a_flipped_byte_fails_every_read_that_touches_it_and_no_other(
    store_of: functools.partial[HiddenStore], store_root: str, dtype: torch.dtype, storage: StorageName, noise: bool
) -> None:
    store = store_of(dtype, storage)
    manifest = store.write("p", np.arange(ROWS), 1, {0: _layer(dtype, noise)})
    truth = np.empty((ROWS, WIDTH), store.numpy_dtype)
    store.read_into("p", [0], truth)
    truth_bytes = truth.view(np.uint8)
    checked = refused = flipped = 0
    for chunk in range(3):
        key = arrays.chunk_key(f"{store.namespace}/prompts/p/layers/0", chunk, 2)
        stored = store.blobs.get(key)
        assert stored is not None
        blocks = len(block_spans(stored))
        flips = _flips(stored)
        flipped += len(flips)
        for offset, region in flips:
            damaged = bytearray(stored)
            damaged[offset] ^= 0x01 << (offset % 8)
            store.blobs.put(key, bytes(damaged))
            for start, stop in _ranges(chunk, blocks):
                touches = _touches(start, stop, chunk, region, blocks)
                try:
                    got = _read_both_ways(store, manifest, start, stop)
                except StoreCorrupt as e:
                    assert touches, (offset, region, start, stop, e)
                    refused += 1
                    continue
                assert not touches, (offset, region, start, stop)
                for bytes_read in got:
                    assert np.array_equal(bytes_read, truth_bytes[start:stop]), (offset, region, start, stop)
                checked += 1
        store.blobs.put(key, stored)
    assert refused >= flipped > 40 and checked >= flipped  # each: the whole read refused, another chunk read
    again = np.empty_like(truth)
    store.read_into("p", [0], again)
    assert np.array_equal(again.view(np.uint8), truth_bytes)


def test_a_piece_damaged_after_the_server_read_it_is_refused_before_it_is_decoded(
    store_of: functools.partial[HiddenStore],
) -> None:
    store = store_of(torch.float32, "exact")
    manifest = store.write("p", np.arange(ROWS), 1, {0: _layer(torch.float32)})
    body = bytearray(pieces_body(store, manifest, [0], 10, 140).joined())
    (length,) = struct.unpack_from("<Q", body)
    start = 8 + length  # the first piece's bytes
    for offset in range(start + HEADER.size + 40, len(body) - 2000, 997):  # inside the pieces' blocks
        damaged = bytearray(body)
        damaged[offset] ^= 0x10
        with pytest.raises(PiecesCorrupt, match="does not match its checksum"):
            decode_pieces(bytes(damaged))


def test_arrays_written_before_block_digests_are_read_and_checked_whole_then_upgraded(
    store_of: functools.partial[HiddenStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:  # an older writer: the chunks' crc32 only
        m.setattr(arrays, "array_objects", functools.partial(arrays.array_objects, block_digests=False))
        store = store_of(torch.bfloat16, "exact")
        manifest = store.write("p", np.arange(ROWS), 1, {0: _layer(torch.bfloat16)})
    key = f"{store.namespace}/prompts/p/layers/0"
    assert arrays.DIGESTS_ATTRIBUTE not in (store.blobs.get(f"{key}/zarr.json") or b"").decode()
    truth = np.empty((ROWS, WIDTH), store.numpy_dtype)
    store.read_into("p", [0], truth)
    for start, stop in [(0, ROWS), (3, 60), (70, 150)]:
        for got in _read_both_ways(store, manifest, start, stop):
            assert np.array_equal(got, truth[start:stop].view(np.uint8))
    stored = store.blobs.get(arrays.chunk_key(key, 0, 2))
    assert stored is not None
    store.blobs.put(arrays.chunk_key(key, 0, 2), stored[:-5] + bytes(b ^ 0xFF for b in stored[-5:]))
    with pytest.raises(StoreCorrupt, match="chunk 0 does not match its checksum"):
        store.read_into("p", [0], np.empty_like(truth))
    store.forget_layers("p", [0])  # as a server does on that error; the capture writes it anew
    store.write("p", np.arange(ROWS), 1, {0: _layer(torch.bfloat16)})
    assert arrays.DIGESTS_ATTRIBUTE in (store.blobs.get(f"{key}/zarr.json") or b"").decode()
    again = np.empty_like(truth)
    store.read_into("p", [0], again)
    assert np.array_equal(again.view(np.uint8), truth.view(np.uint8))
