"""Decoded layers kept in RAM (`--ram-cache-gb`), so that a repeated `/hidden` decodes nothing.

Entries are whole layers [T, H] in the stored element type, keyed by (target fingerprint, prompt id,
layer id): a published layer never changes, and an entry can only answer for the very layer of the
very target it was decoded from. Least recently used out first, bounded in bytes. (Its counterpart
on the worker's side, `eval_worker/evaluation/feature_cache.py`, keeps fetched layer sets per
checkpoint run; this one saves the server's decode for every client.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

Key = tuple[str, str, int]  # (fingerprint, prompt id, layer id)


class RamCache:
    """A bounded LRU of decoded layers; it counts its hits and misses."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Key, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, fingerprint: str, prompt_id: str, layer: int) -> np.ndarray | None:
        """The decoded layer (read-only), or None."""
        key = (fingerprint, prompt_id, layer)
        with self._lock:
            found = self._items.get(key)
            if found is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return found

    def drop(self, fingerprint: str, prompt_id: str, layers: Iterable[int]) -> None:
        """Forget these layers of a prompt (they are written again, or no longer stored)."""
        with self._lock:
            for layer in layers:
                old = self._items.pop((fingerprint, prompt_id, layer), None)
                self._bytes -= old.nbytes if old is not None else 0

    def put(self, fingerprint: str, prompt_id: str, layer: int, array: np.ndarray) -> None:
        """Keep a decoded layer, evicting the least recently used until it fits (too big: not kept)."""
        if array.nbytes > self.capacity_bytes:
            return
        array.flags.writeable = False  # shared by every request that reads it
        key = (fingerprint, prompt_id, layer)
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes -= old.nbytes if old is not None else 0
            while self._items and self._bytes + array.nbytes > self.capacity_bytes:
                self._bytes -= self._items.popitem(last=False)[1].nbytes
            self._items[key] = array
            self._bytes += array.nbytes
