"""Fetched features kept resident between evaluations, and fetched ahead while the drafter runs.

Every checkpoint of a training run reads the same layers of the same prompts, so the worker keeps
them: keyed by (target fingerprint, prompt id, layer list), bounded in bytes, least recently used
out first, in host RAM or on the drafter's device. A new target fingerprint empties the cache: a
stale feature is never served. Misses are fetched on a background thread a few prompts ahead of the
consumer, so a cold evaluation takes about max(fetch, compute) rather than their sum. (The server
keeps decoded layers too, `cache_server/store/ram_cache.py`, for every client; this one saves the
fetch itself.)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from eval_worker.evaluation.source import FeatureSource
from schemas.hidden import HiddenMetadata

_AHEAD = 8  # prompts fetched ahead of the one being evaluated (about the next group of long prompts)


@dataclass(frozen=True)
class Features:
    """One prompt's served features as tensors: hidden [T, K*H] (served dtype) and token ids [T]."""

    hidden: torch.Tensor
    token_ids: torch.Tensor
    metadata: HiddenMetadata

    @property
    def nbytes(self) -> int:
        """Bytes held (hidden states and token ids)."""
        return self.hidden.nbytes + self.token_ids.nbytes


@dataclass(frozen=True)
class Fetched:
    """A prompt's features as handed to the evaluator, and what getting them cost."""

    prompt_id: str
    features: Features
    fetched_bytes: int  # 0 on a cache hit
    wait_s: float  # time the consumer waited for it


class FeatureCache:
    """A bounded LRU of `Features`; `capacity_bytes` 0 keeps nothing (every prompt is fetched)."""

    def __init__(self, capacity_bytes: int, device: torch.device | str = "cpu") -> None:
        self.capacity_bytes = capacity_bytes
        self.device = torch.device(device)
        self._items: OrderedDict[tuple[str, str, tuple[int, ...]], Features] = OrderedDict()
        self._fingerprint: str | None = None
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def use_target(self, fingerprint: str) -> None:
        """Serve only features of `fingerprint` from now on: another target empties the cache."""
        with self._lock:
            if fingerprint != self._fingerprint:
                self._items.clear()
                self._bytes = 0
                self._fingerprint = fingerprint

    def get(self, prompt_id: str, layers: Sequence[int]) -> Features | None:
        """The resident features of a prompt and layer list, or None."""
        with self._lock:
            key = (self._fingerprint or "", prompt_id, tuple(layers))
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, prompt_id: str, layers: Sequence[int], features: Features) -> None:
        """Keep `features`, evicting the least recently used until they fit (too big: not kept)."""
        if features.metadata.model_fingerprint != self._fingerprint or features.nbytes > self.capacity_bytes:
            return
        with self._lock:
            key = (self._fingerprint, prompt_id, tuple(layers))
            old = self._items.pop(key, None)
            self._bytes -= old.nbytes if old is not None else 0
            while self._items and self._bytes + features.nbytes > self.capacity_bytes:
                self._bytes -= self._items.popitem(last=False)[1].nbytes
            self._items[key] = features
            self._bytes += features.nbytes

    def iterate(
        self, source: FeatureSource, prompt_ids: Sequence[str], layers: Sequence[int]
    ) -> Generator[Fetched, None, None]:
        """Each prompt's features in order: resident ones at once, the others fetched ahead on a
        background thread. Call `use_target` first."""
        layers = list(layers)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="feature-fetch") as pool:
            pending: dict[int, Future[Features]] = {}
            for i, prompt_id in enumerate(prompt_ids):
                for j in range(i, min(i + 1 + _AHEAD, len(prompt_ids))):
                    if j not in pending and self.get(prompt_ids[j], layers) is None:
                        pending[j] = pool.submit(self._fetch, source, prompt_ids[j], layers)
                started = time.perf_counter()
                future = pending.pop(i, None)
                resident = self.get(prompt_id, layers) if future is None else None
                if resident is not None:
                    yield Fetched(prompt_id, resident, 0, time.perf_counter() - started)
                    continue
                if future is None:  # evicted since it was looked up: fetch it now
                    future = pool.submit(self._fetch, source, prompt_id, layers)
                features = future.result()
                self.put(prompt_id, layers, features)
                yield Fetched(prompt_id, features, features.nbytes, time.perf_counter() - started)

    def _fetch(self, source: FeatureSource, prompt_id: str, layers: list[int]) -> Features:
        result = source.hidden(prompt_id, layers)
        hidden, token_ids = result.to_torch()
        if self.device.type != "cpu":
            hidden, token_ids = hidden.to(self.device), token_ids.to(self.device)
        return Features(hidden, token_ids, result.metadata)
