"""The resident-feature cache: hits without fetching, LRU by bytes, never another target's features,
and fetching ahead of the consumer."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from cache_server.client import HiddenResult, TargetHeads
from eval_worker.evaluation.feature_cache import FeatureCache
from schemas.hidden import HiddenMetadata
from schemas.model import ModelInfo

T, WIDTH = 10, 6
ITEM_BYTES = T * WIDTH * 4 + T * 8  # fp32 features + int64 token ids


class CountingSource:
    """Serves prompt i as features filled with i, for target `fingerprint`; counts and can hold fetches."""

    def __init__(self, fingerprint: str = "fp") -> None:
        self.fingerprint, self.calls = fingerprint, []  # type: ignore[var-annotated]
        self.fetched: dict[str, threading.Event] = {}

    def model(self) -> ModelInfo:
        raise NotImplementedError

    def heads(self) -> TargetHeads:
        raise NotImplementedError

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        self.calls.append(prompt_id)
        self.fetched.setdefault(prompt_id, threading.Event()).set()
        value = float(prompt_id.removeprefix("p"))
        meta = HiddenMetadata(
            prompt_id=prompt_id,
            layers=list(layers),
            layer_convention="decoder_output_0based",
            model_fingerprint=self.fingerprint,
            hidden_size=WIDTH // len(layers),
            prompt_len=2,
            start=0,
            stop=T,
            dtype="float32",
        )
        return HiddenResult(np.full((T, WIDTH), value, np.float32), np.arange(T, dtype=np.int64), meta)


def _ids(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def test_a_second_pass_is_served_from_memory() -> None:
    cache, source = FeatureCache(10 * ITEM_BYTES), CountingSource()
    cache.use_target("fp")
    first = list(cache.iterate(source, _ids(4), [1, 2]))
    assert [f.prompt_id for f in first] == _ids(4) and [f.fetched_bytes for f in first] == [ITEM_BYTES] * 4
    assert [float(f.features.hidden[0, 0]) for f in first] == [0.0, 1.0, 2.0, 3.0]
    second = list(cache.iterate(source, _ids(4), [1, 2]))
    assert source.calls == _ids(4) and [f.fetched_bytes for f in second] == [0] * 4
    assert cache.nbytes == 4 * ITEM_BYTES
    list(cache.iterate(source, _ids(2), [2, 1]))  # another layer order is another key
    assert source.calls == [*_ids(4), *_ids(2)]


def test_least_recently_used_goes_first_and_the_bound_holds() -> None:
    cache, source = FeatureCache(2 * ITEM_BYTES), CountingSource()
    cache.use_target("fp")
    list(cache.iterate(source, ["p0", "p1"], [1]))
    list(cache.iterate(source, ["p0"], [1]))  # p0 is now more recent than p1
    list(cache.iterate(source, ["p2"], [1]))  # evicts p1
    assert cache.nbytes == 2 * ITEM_BYTES
    assert cache.get("p0", [1]) is not None and cache.get("p1", [1]) is None
    assert FeatureCache(0).capacity_bytes == 0


def test_another_target_never_sees_old_features() -> None:
    cache = FeatureCache(10 * ITEM_BYTES)
    cache.use_target("old")
    list(cache.iterate(CountingSource("old"), _ids(2), [1]))
    cache.use_target("new")
    assert cache.nbytes == 0 and cache.get("p0", [1]) is None
    newer = CountingSource("new")
    assert [f.fetched_bytes for f in cache.iterate(newer, _ids(2), [1])] == [ITEM_BYTES] * 2
    stale = CountingSource("old")  # a server that still answers for the old target: not kept
    list(cache.iterate(stale, ["p9"], [1]))
    assert cache.get("p9", [1]) is None


def test_misses_are_fetched_ahead_of_the_consumer() -> None:
    cache, source = FeatureCache(0), CountingSource()
    cache.use_target("fp")
    fetched = cache.iterate(source, _ids(3), [1])
    assert next(fetched).prompt_id == "p0"
    # While the consumer still works on p0, the next prompt is fetched in the background.
    assert source.fetched.setdefault("p1", threading.Event()).wait(timeout=10)
    assert [f.prompt_id for f in fetched] == ["p1", "p2"]


@pytest.mark.parametrize("capacity", [0, ITEM_BYTES - 1])
def test_what_does_not_fit_is_not_kept(capacity: int) -> None:
    cache, source = FeatureCache(capacity), CountingSource()
    cache.use_target("fp")
    list(cache.iterate(source, _ids(2), [1]))
    list(cache.iterate(source, _ids(2), [1]))
    assert source.calls == _ids(2) * 2 and cache.nbytes == 0
