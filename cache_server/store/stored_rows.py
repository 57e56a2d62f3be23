"""Rows of published layers as stored (the target dtype's bit patterns, or an FP8 store's bytes), from
the RAM cache when it holds them and from the store's objects otherwise; and as values (an FP8
store's dequantized)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from cache_server.store.errors import LayersNotStored, StoreCorrupt
from cache_server.store.manifest import PromptManifest
from cache_server.store.ram_cache import RamCache
from cache_server.store.reader import EncodedPiece, LayerRead, LayerReader
from schemas.fp8 import dequantize
from schemas.storage import StorageName


class StoredRows:
    """Reads one namespace's layers in their stored element type (`element`, width `hidden_size`).

    A layer whose files are gone because a prune (or another server's recovery) dropped it since the
    caller read the prompt's manifest is not stored (LayersNotStored: to be captured again), not
    corrupt: the manifest read afresh (`fresh_manifest`) tells the two apart."""

    def __init__(
        self,
        reader: LayerReader,
        ram: RamCache | None,
        namespace: str,
        hidden_size: int,
        element: np.dtype[Any],
        storage: StorageName,
        fresh_manifest: Callable[[str], PromptManifest | None],
    ) -> None:
        self._fp8 = storage == "float8_e4m3fn"
        self._fresh_manifest = fresh_manifest
        self._reader = reader
        self._ram = ram
        self._namespace = namespace
        self._h = hidden_size
        self._element = element

    def values(self, m: PromptManifest, layers: Sequence[int], out: np.ndarray, start: int, stop: int) -> None:
        """Fill `out` ([stop - start, len(layers) * H] of the target's numpy dtype) with the values of
        rows start:stop of `layers`: the stored bits, or an FP8 store's bytes dequantized."""
        with self._pruned_as_missing(m.prompt_id):
            if not self._fp8:
                self._stored(m, layers, out.view(self._element), start, stop)
                return
            stored, h = np.empty(out.shape, np.uint8), self._h
            self._stored(m, layers, stored, start, stop)
            scales = [self._reader.scales(m, k)[start:stop] for k in layers]

            def one(i: int) -> None:
                columns = slice(i * h, (i + 1) * h)
                dequantize(stored[:, columns], scales[i], out[:, columns])

            self._reader.each(one, range(len(layers)))  # a layer per pool thread

    def scales(self, m: PromptManifest, layers: Sequence[int], start: int, stop: int) -> np.ndarray:
        """An FP8 store's scales of rows start:stop, float32 [len(layers), stop - start]."""
        with self._pruned_as_missing(m.prompt_id):
            return np.stack([self._reader.scales(m, k)[start:stop] for k in layers]) if layers else np.empty((0, 0))

    def _stored(self, m: PromptManifest, layers: Sequence[int], raw: np.ndarray, start: int, stop: int) -> None:
        """Fill `raw[:, i*H:(i+1)*H]` ([stop - start, len(layers) * H] of the stored element type) with
        rows start:stop of layer `layers[i]`. With a RAM cache, layers found there are copied, and the
        others are decoded whole and kept."""
        h, ram = self._h, self._ram
        reads: list[LayerRead] = []
        decoded: list[tuple[int, np.ndarray, np.ndarray]] = []  # (layer, whole layer, its columns in raw)
        for i, k in enumerate(layers):
            columns = raw[:, i * h : (i + 1) * h]  # [stop - start, H]
            if ram is None:
                reads.append((k, columns, start, stop))
                continue
            cached = ram.get(self._namespace, m.prompt_id, k)
            if cached is not None:
                columns[...] = cached[start:stop]
                continue
            whole = np.empty((m.num_tokens, h), self._element)  # decoded whole, to be kept
            reads.append((k, whole, 0, m.num_tokens))
            decoded.append((k, whole, columns))
        self._reader.read(m, reads)
        for k, whole, columns in decoded:
            columns[...] = whole[start:stop]
            ram.put(self._namespace, m.prompt_id, k, whole)  # type: ignore[union-attr]

    def encoded(self, m: PromptManifest, layers: Sequence[int], start: int, stop: int) -> list[list[EncodedPiece]]:
        """Per layer (request order), rows start:stop as stored: Blosc chunks cut to the blocks the rows
        need, or raw rows (RAM-cached, stored uncompressed, or of another layout: decoded here)."""
        with self._pruned_as_missing(m.prompt_id):
            return self._encoded(m, layers, start, stop)

    def _encoded(self, m: PromptManifest, layers: Sequence[int], start: int, stop: int) -> list[list[EncodedPiece]]:
        ram = self._ram
        cached = {k: ram.get(self._namespace, m.prompt_id, k) if ram is not None else None for k in layers}
        on_disk = [k for k in layers if cached[k] is None]
        stored = dict(zip(on_disk, self._reader.encoded(m, on_disk, start, stop), strict=True))
        out = []
        for k in layers:
            pieces, rows = stored.get(k), cached[k]
            if pieces is None:  # sent decoded: from RAM (no copy: cached arrays never change), or decoded here
                if rows is None:
                    part = np.empty((stop - start, self._h), self._element)
                    self._reader.read(m, [(k, part, start, stop)])
                else:
                    part = rows[start:stop]
                raw = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
                pieces = [(0, stop - start, "raw", memoryview(raw.data), 0, ())]
            out.append(pieces)
        return out

    @contextmanager
    def _pruned_as_missing(self, prompt_id: str) -> Iterator[None]:
        try:
            yield
        except StoreCorrupt as e:
            fresh = self._fresh_manifest(prompt_id) if e.layers else None
            gone = sorted(set(e.layers) - set(fresh.layers)) if fresh is not None else []
            if not gone:
                raise
            self._reader.forget(prompt_id, gone)
            raise LayersNotStored(prompt_id, gone) from e
