"""Rows of published layers as stored (the target dtype's bit patterns, or an FP8 store's bytes), from
the RAM cache when it holds them and from the store's objects otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cache_server.store.manifest import PromptManifest
from cache_server.store.ram_cache import RamCache
from cache_server.store.reader import EncodedPiece, LayerRead, LayerReader


class StoredRows:
    """Reads one namespace's layers in their stored element type (`element`, width `hidden_size`)."""

    def __init__(
        self, reader: LayerReader, ram: RamCache | None, namespace: str, hidden_size: int, element: np.dtype[Any]
    ) -> None:
        self._reader = reader
        self._ram = ram
        self._namespace = namespace
        self._h = hidden_size
        self._element = element

    def read(self, m: PromptManifest, layers: Sequence[int], raw: np.ndarray, start: int, stop: int) -> None:
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
                pieces = [(0, stop - start, "raw", memoryview(raw.data), 0)]
            out.append(pieces)
        return out
