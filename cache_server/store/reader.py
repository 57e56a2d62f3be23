"""The read half of the store: rows of published layers into a caller's buffer, on a thread pool.

Published arrays never change, so reads need no lock, and recently opened arrays are kept (opening
one reads and parses its zarr.json: ~0.6 ms locally, against ~10 ms to read a layer). A layer's
zarr.json holds its chunks' checksums, and the manifest holds the checksum of that zarr.json.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

import numpy as np
import zarr
from zarr.core.metadata import ArrayV3Metadata

from cache_server.store import blosc_reader, chunks, fp8
from cache_server.store.blobs import Blobs
from cache_server.store.errors import StoreCorrupt
from cache_server.store.manifest import PromptManifest

_OPEN_ARRAYS = 1024  # opened zarr arrays kept (LRU)
_TOKEN_IDS_KEPT = 4096  # prompts whose token ids are kept (LRU; they never change once published)
# Errors zarr/numcodecs raise on a missing or damaged array file.
READ_ERRORS = (OSError, ValueError, RuntimeError, KeyError, zarr.errors.BaseZarrError)
# An opened layer: its chunks for `blosc_reader.ChunkReader` when it is laid out as
# `chunks.array_objects` writes it (faster than zarr), else the array for zarr to read.
_Layer = blosc_reader.BloscChunks | zarr.Array[Any]
LayerRead = tuple[int, np.ndarray, int, int]  # (layer id, out [stop - start, H], start, stop)
# (first row in the range, rows, "blosc" | "raw", payload, skip, the digests of a "blosc" payload's blocks)
EncodedPiece = tuple[int, int, str, memoryview, int, tuple[int, ...]]


class LayerReader:
    """Reads the arrays under `<prompts>/<id>/` of one namespace."""

    def __init__(
        self, blobs: Blobs, prompts: str, *, hidden_size: int, storage_dtype: np.dtype[Any], threads: int
    ) -> None:
        self._blobs = blobs
        self._prompts = prompts
        self._hidden_size = hidden_size
        self._storage_dtype = storage_dtype
        self._arrays: OrderedDict[tuple[str, int], _Layer] = OrderedDict()
        self._token_ids: OrderedDict[str, np.ndarray] = OrderedDict()
        self._scales: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()  # an FP8 store's
        self._guard = threading.Lock()
        self._chunk_reader = blosc_reader.ChunkReader()  # per-thread buffers: used only from self._pool
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hidden-store")

    def close(self) -> None:
        """Finish the reads in flight and stop the pool."""
        self._pool.shutdown(wait=True)

    def open(self, prompt_id: str, rel: str) -> zarr.Array[Any]:
        """The array at `<prompts>/<prompt_id>/<rel>`, through zarr; StoreCorrupt if it cannot be opened."""
        try:
            return zarr.open_array(store=self._blobs.zarr_store(f"{self._prompts}/{prompt_id}/{rel}"), mode="r")
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {prompt_id!r}: {rel} unreadable: {e}") from e

    def token_ids(self, prompt_id: str) -> np.ndarray:
        """A prompt's token ids (int64, read-only), kept once read; READ_ERRORS if unreadable."""
        with self._guard:
            kept = self._token_ids.get(prompt_id)
        if kept is not None:
            return kept
        arr = zarr.open_array(store=self._blobs.zarr_store(f"{self._prompts}/{prompt_id}/token_ids"), mode="r")
        ids = np.asarray(arr[:], dtype=np.int64)
        ids.flags.writeable = False
        with self._guard:
            self._token_ids[prompt_id] = ids
            if len(self._token_ids) > _TOKEN_IDS_KEPT:
                self._token_ids.popitem(last=False)
        return ids

    def scales(self, m: PromptManifest, layer: int) -> np.ndarray:
        """An FP8 layer's per-token scales (float32 [T], read-only), kept once read and checked."""
        key = (m.prompt_id, layer)
        with self._guard:
            kept = self._scales.get(key)
        if kept is not None:
            return kept
        try:
            crc32 = (m.scale_crc32 or {})[layer]
            found = fp8.read_scales(self._blobs, f"{self._prompts}/{m.prompt_id}/scales/{layer}", crc32, m.num_tokens)
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {m.prompt_id!r} layer {layer} scales: {e}", [layer]) from e
        with self._guard:
            self._scales[key] = found
            if len(self._scales) > _OPEN_ARRAYS:
                self._scales.popitem(last=False)
        return found

    def each(self, fn: Callable[[int], None], items: Sequence[int]) -> None:
        """`fn(item)` for every item on the pool, every one finished before returning or raising."""
        futures = [self._pool.submit(fn, item) for item in items]
        wait(futures)
        for f in futures:
            f.result()

    def read(self, m: PromptManifest, wanted: Sequence[LayerRead]) -> None:
        """Fill each read's `out` (storage dtype, [stop - start, H], a strided view is fine) with rows
        start:stop of its layer.

        One pool task per (layer, chunk) decodes the chunk (or the blocks of it the rows need) and
        copies it once into its rows of `out` (one task per layer read through zarr)."""
        reads: list[tuple[int, Callable[[], None]]] = []  # (layer, one read into an `out`)
        for k, dst, start, stop in wanted:
            blosc = self._layer_array(m, k)
            if not isinstance(blosc, blosc_reader.BloscChunks):
                exists = partial(_exists, self._blobs, self._layer_key(m.prompt_id, k))
                reads.append((k, partial(chunks.read_rows, blosc, exists, start, stop, dst)))
                continue
            for c, lo, hi, at in blosc.pieces(start, stop):
                reads.append((k, partial(self._chunk_reader.read, blosc, c, lo, hi, dst[at : at + hi - lo])))
        futures = [self._pool.submit(_read_guarded, m.prompt_id, k, read) for k, read in reads]
        wait(futures)  # all of them: none may still be writing into an `out` once we return or raise
        for f in futures:
            f.result()

    def encoded(
        self, m: PromptManifest, layers: Sequence[int], start: int, stop: int
    ) -> list[list[EncodedPiece] | None]:
        """Per layer, rows start:stop as stored (see `ChunkReader.encoded`), read on the pool; None for a
        layer not laid out as `chunks.array_objects` writes it (the caller decodes those)."""
        plans: list[list[tuple[int, int, Future[tuple[str, memoryview, int, tuple[int, ...]]]]] | None] = []
        for k in layers:
            blosc = self._layer_array(m, k)
            if not isinstance(blosc, blosc_reader.BloscChunks):
                plans.append(None)
                continue
            read = partial(_encoded_guarded, m.prompt_id, k, blosc)
            plans.append(
                [(at, hi - lo, self._pool.submit(read, c, lo, hi)) for c, lo, hi, at in blosc.pieces(start, stop)]
            )
        futures = [f for plan in plans if plan for _, _, f in plan]
        wait(futures)  # all of them, before any error is raised
        return [None if plan is None else [(at, n, *f.result()) for at, n, f in plan] for plan in plans]

    def forget(self, prompt_id: str, layers: Sequence[int]) -> None:
        """Drop what is known of these layers' arrays (they are about to be written again)."""
        with self._guard:
            for k in layers:
                self._arrays.pop((prompt_id, k), None)
                self._scales.pop((prompt_id, k), None)

    def _layer_key(self, prompt_id: str, layer: int) -> str:
        return f"{self._prompts}/{prompt_id}/layers/{layer}"

    def _layer_array(self, m: PromptManifest, layer: int) -> _Layer:
        prompt_id = m.prompt_id
        key = (prompt_id, layer)
        with self._guard:
            found = self._arrays.get(key)
            if found is not None:
                self._arrays.move_to_end(key)
        if found is None:
            found = self._open_layer(m, layer)
            with self._guard:
                self._arrays[key] = found
                if len(self._arrays) > _OPEN_ARRAYS:
                    self._arrays.popitem(last=False)
        return found

    def _open_layer(self, m: PromptManifest, layer: int) -> _Layer:
        """A layer's metadata, checked against the manifest (its checksum, shape and dtype)."""
        prompt_id, array = m.prompt_id, self._layer_key(m.prompt_id, layer)
        try:
            raw = self._blobs.get(f"{array}/{chunks.ZARR_JSON}")
            if raw is None:
                raise FileNotFoundError("its zarr.json is missing")
            expected = m.layer_crc32.get(layer) if m.layer_crc32 is not None else None
            if expected is not None and zlib.crc32(raw) != expected:
                raise ValueError("its zarr.json does not match the manifest's checksum")
            md = ArrayV3Metadata.from_dict(json.loads(raw))
            if md.shape != (m.num_tokens, self._hidden_size) or md.data_type.to_native_dtype() != self._storage_dtype:
                raise ValueError(
                    f"array {md.data_type.to_native_dtype()} {md.shape} does not match the manifest "
                    f"({m.num_tokens}, {self._hidden_size})"
                )
            found = blosc_reader.blosc_chunks(md, self._blobs, array)
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {prompt_id!r} layer {layer}: {e}", [layer]) from e
        return found if found is not None else self.open(prompt_id, f"layers/{layer}")


def _exists(blobs: Blobs, array: str, chunk: str) -> bool:
    return blobs.exists(f"{array}/{chunk}")


def _encoded_guarded(
    prompt_id: str, layer: int, blosc: blosc_reader.BloscChunks, chunk: int, lo: int, hi: int
) -> tuple[str, memoryview, int, tuple[int, ...]]:
    try:
        return blosc_reader.ChunkReader.encoded(blosc, chunk, lo, hi)
    except READ_ERRORS as e:
        raise StoreCorrupt(f"prompt {prompt_id!r} layer {layer}: {e}", [layer]) from e


def _read_guarded(prompt_id: str, layer: int, read: Callable[[], None]) -> None:
    try:
        read()
    except READ_ERRORS as e:
        raise StoreCorrupt(f"prompt {prompt_id!r} layer {layer}: {e}", [layer]) from e
