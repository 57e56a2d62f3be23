"""The read half of the store: rows of published layers into a caller's buffer, on a thread pool.

Published files never change, so reads need no lock, and recently opened arrays are kept (opening
one parses its zarr.json: ~0.6 ms, against ~10 ms to read a layer).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from cache_server.store import blosc_reader, chunks
from cache_server.store.manifest import PromptManifest, StoreCorrupt

_OPEN_ARRAYS = 1024  # opened zarr arrays kept (LRU)
# Errors zarr/numcodecs raise on a missing or damaged array file.
READ_ERRORS = (OSError, ValueError, RuntimeError, KeyError, zarr.errors.BaseZarrError)
# An opened layer array and, when it is laid out as `chunks.write_array` writes it, its chunks for
# `blosc_reader.ChunkReader` (faster than zarr; None: read through zarr).
_Layer = tuple[zarr.Array[Any], blosc_reader.BloscChunks | None]
LayerRead = tuple[int, np.ndarray, int, int]  # (layer id, out [stop - start, H], start, stop)
# (first row in the range, rows, "blosc" | "raw", payload, skip)
EncodedPiece = tuple[int, int, str, memoryview, int]


class LayerReader:
    """Reads the arrays under `prompts/<id>/` of one namespace."""

    def __init__(self, prompts: Path, *, hidden_size: int, storage_dtype: np.dtype[Any], threads: int) -> None:
        self._prompts = prompts
        self._hidden_size = hidden_size
        self._storage_dtype = storage_dtype
        self._arrays: OrderedDict[tuple[str, int], _Layer] = OrderedDict()
        self._guard = threading.Lock()
        self._chunk_reader = blosc_reader.ChunkReader()  # per-thread buffers: used only from self._pool
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hidden-store")

    def close(self) -> None:
        """Finish the reads in flight and stop the pool."""
        self._pool.shutdown(wait=True)

    def open(self, prompt_id: str, rel: str) -> zarr.Array[Any]:
        """The array at `prompts/<prompt_id>/<rel>`; StoreCorrupt if it cannot be opened."""
        try:
            return chunks.open_array(self._prompts / prompt_id / rel)
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {prompt_id!r}: {rel} unreadable: {e}") from e

    def read(self, m: PromptManifest, wanted: Sequence[LayerRead]) -> None:
        """Fill each read's `out` (storage dtype, [stop - start, H], a strided view is fine) with rows
        start:stop of its layer.

        One pool task per (layer, chunk) decodes the chunk (or the blocks of it the rows need) and
        copies it once into its rows of `out` (one task per layer read through zarr)."""
        reads: list[tuple[int, Callable[[], None]]] = []  # (layer, one read into an `out`)
        for k, dst, start, stop in wanted:
            arr, blosc = self._layer_array(m, k)
            if blosc is None:
                reads.append((k, partial(chunks.read_rows, arr, self._layer_dir(m.prompt_id, k), start, stop, dst)))
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
        layer not laid out as `chunks.write_array` writes it (the caller decodes those)."""
        plans: list[list[tuple[int, int, Future[tuple[str, memoryview, int]]]] | None] = []
        for k in layers:
            _, blosc = self._layer_array(m, k)
            if blosc is None:
                plans.append(None)
                continue
            read = partial(_encoded_guarded, m.prompt_id, k, blosc)
            plans.append(
                [(at, hi - lo, self._pool.submit(read, c, lo, hi)) for c, lo, hi, at in blosc.pieces(start, stop)]
            )
        futures = [f for plan in plans if plan for _, _, f in plan]
        wait(futures)  # all of them, before any error is raised
        return [None if plan is None else [(at, n, *f.result()) for at, n, f in plan] for plan in plans]

    def _layer_dir(self, prompt_id: str, layer: int) -> Path:
        return self._prompts / prompt_id / "layers" / str(layer)

    def _layer_array(self, m: PromptManifest, layer: int) -> _Layer:
        prompt_id = m.prompt_id
        key = (prompt_id, layer)
        with self._guard:
            found = self._arrays.get(key)
            if found is not None:
                self._arrays.move_to_end(key)
        if found is None:
            arr = self.open(prompt_id, f"layers/{layer}")
            if arr.shape != (m.num_tokens, self._hidden_size) or arr.dtype != self._storage_dtype:
                raise StoreCorrupt(
                    f"prompt {prompt_id!r} layer {layer}: array {arr.dtype} {arr.shape} does not match "
                    f"the manifest ({m.num_tokens}, {self._hidden_size})"
                )
            found = (arr, blosc_reader.blosc_chunks(arr, self._layer_dir(prompt_id, layer)))
            with self._guard:
                self._arrays[key] = found
                if len(self._arrays) > _OPEN_ARRAYS:
                    self._arrays.popitem(last=False)
        return found


def _encoded_guarded(prompt_id: str, layer: int, blosc: blosc_reader.BloscChunks, chunk: int, lo: int,
                     hi: int) -> tuple[str, memoryview, int]:  # fmt: skip
    try:
        return blosc_reader.ChunkReader.encoded(blosc, chunk, lo, hi)
    except READ_ERRORS as e:
        raise StoreCorrupt(f"prompt {prompt_id!r} layer {layer}: {e}") from e


def _read_guarded(prompt_id: str, layer: int, read: Callable[[], None]) -> None:
    try:
        read()
    except READ_ERRORS as e:
        raise StoreCorrupt(f"prompt {prompt_id!r} layer {layer}: {e}") from e
