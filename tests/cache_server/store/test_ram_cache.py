"""Decoded layers in RAM: exact bytes, and an entry only ever answers for its own target and layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cache_server.store.hidden_store import HiddenStore
from cache_server.store.ram_cache import RamCache
from testing.tensors import as_numpy

H, T = 16, 40
TOKENS = np.arange(100, 100 + T)


def _layer(seed: int) -> torch.Tensor:
    return torch.randn(T, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _read(store: HiddenStore, layers: list[int], start: int = 0, stop: int = T) -> np.ndarray:
    out = np.empty((stop - start, len(layers) * H), store.numpy_dtype)
    store.read_into("p", layers, out, start, stop)
    return out.view(np.uint16)


def test_entries_are_keyed_by_target_prompt_and_layer() -> None:
    cache = RamCache(1 << 20)
    layer = np.arange(12, dtype=np.uint16).reshape(3, 4)
    cache.put("fp-a", "p", 1, layer)
    assert cache.get("fp-a", "p", 1) is layer
    assert cache.get("fp-b", "p", 1) is None  # another target
    assert cache.get("fp-a", "p", 2) is None  # another layer
    assert cache.get("fp-a", "q", 1) is None  # another prompt
    assert (cache.hits, cache.misses) == (1, 3)
    with pytest.raises(ValueError):
        layer[0, 0] = 7  # shared by every request: read-only once kept


def test_least_recently_used_goes_first_and_too_big_is_not_kept() -> None:
    one = np.zeros(100, np.uint8)
    cache = RamCache(250)
    cache.put("f", "a", 0, one.copy())
    cache.put("f", "b", 0, one.copy())
    assert cache.get("f", "a", 0) is not None  # a is now the most recent
    cache.put("f", "c", 0, one.copy())  # evicts b
    assert cache.get("f", "b", 0) is None and cache.get("f", "c", 0) is not None
    assert cache.nbytes == 200 and len(cache) == 2
    cache.put("f", "d", 0, np.zeros(300, np.uint8))
    assert cache.get("f", "d", 0) is None


def test_store_reads_through_the_cache_are_exact_and_decode_once(tmp_path: Path) -> None:
    layers = {k: _layer(k) for k in range(3)}
    ram = RamCache(1 << 20)
    with HiddenStore(
        tmp_path, fingerprint="fp", model_name="m", hidden_size=H, dtype=torch.bfloat16, ram_cache=ram
    ) as store:
        store.write("p", TOKENS, 8, layers)
        want = np.concatenate([as_numpy(layers[k]).view(np.uint16) for k in (2, 0)], axis=1)
        assert np.array_equal(_read(store, [2, 0]), want)  # decoded, kept
        assert (ram.hits, ram.misses, len(ram)) == (0, 2, 2)
        store.blobs.delete(f"{store.namespace}/prompts/p/layers")  # from now on only RAM can answer
        assert np.array_equal(_read(store, [2, 0]), want)
        assert np.array_equal(_read(store, [0], 5, 17), want[5:17, H:])
        assert ram.hits == 3


def test_another_target_on_the_same_cache_never_sees_these_layers(tmp_path: Path) -> None:
    ram = RamCache(1 << 20)
    mine, theirs = _layer(0), _layer(1)
    with HiddenStore(
        tmp_path, fingerprint="fp-a", model_name="m", hidden_size=H, dtype=torch.bfloat16, ram_cache=ram
    ) as a:
        a.write("p", TOKENS, 8, {0: mine})
        assert np.array_equal(_read(a, [0]), as_numpy(mine).view(np.uint16))
    with HiddenStore(
        tmp_path, fingerprint="fp-b", model_name="m", hidden_size=H, dtype=torch.bfloat16, ram_cache=ram
    ) as b:
        b.write("p", TOKENS, 8, {0: theirs})  # same prompt id and layer, another target
        assert np.array_equal(_read(b, [0]), as_numpy(theirs).view(np.uint16))
    assert len(ram) == 2 and ram.hits == 0
