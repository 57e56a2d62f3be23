"""The orphan sweep beside a prune, and what it leaves: the files a running prune dropped stay until
its grace has passed (the prune deletes them), a dead prune's record expires and its files go, and
nothing an interrupted write leaves survives a sweep, a layers group's temporary file included."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import torch

from cache_server.store.blobs import LocalBlobs
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.hierarchy import group_json
from cache_server.store.prune import prune
from cache_server.store.prune_record import PruneRecord, scheduled
from tests.cache_server.published import unpublished
from tests.cache_server.store.test_prune import LAYERS, T, _open, _read


def _start_a_server(root: str, storage: str = "exact", grace_s: float = 0) -> None:
    """What a server's start does to the store: open it, and sweep orphans older than `grace_s`."""
    with HiddenStore(
        root,
        fingerprint=f"ns-{storage}",
        model_name="m",
        hidden_size=LAYERS[0].shape[1],
        dtype=torch.bfloat16,
        storage=storage,  # type: ignore[arg-type]
        orphan_grace_s=grace_s,
    ) as store:
        store.swept.result()


def _arrays(store: HiddenStore, pid: str) -> list[int]:
    return sorted(int(k) for k in store.blobs.children(f"{store.namespace}/prompts/{pid}/layers"))


@pytest.mark.parametrize("storage", ["exact", "float8_e4m3fn"])
def test_a_sweep_during_the_grace_leaves_the_dropped_files_to_the_prune(store_root: str, storage: str) -> None:
    with _open(store_root, storage) as writer, _open(store_root, storage) as other:
        for pid in "ab":
            writer.write(pid, np.arange(T), 5, LAYERS)
        before = {pid: _read(other, pid, [0, 1, 2, 3]) for pid in "ab"}  # `other` holds the old manifests
        during = []

        def grace(seconds: float) -> None:
            assert [len(scheduled(writer.blobs, writer.namespace))] == [1]
            _start_a_server(store_root, storage)  # sweeps every orphan, however young
            for pid in "ab":
                assert _arrays(writer, pid) == [0, 1, 2, 3]  # the prune's, not the sweep's
                assert _read(other, pid, [0, 1, 2, 3]) == before[pid]  # reads begun before finish
            during.append(seconds)

        result = prune(writer, [1], ["a", "b"], grace_s=3, sleep=grace)
        assert during == [3] and result.dropped == {"a": (0, 2, 3), "b": (0, 2, 3)}
        assert [_arrays(writer, pid) for pid in "ab"] == [[1], [1]]
        assert scheduled(writer.blobs, writer.namespace) == []  # the record went with the files
        assert unpublished(writer.blobs, writer.namespace) == {}


def test_a_dead_prunes_record_expires_and_its_files_go(store_root: str) -> None:
    with _open(store_root) as store:
        for pid in "ab":
            store.write(pid, np.arange(T), 5, LAYERS)
        # A prune that died after republishing: its record's promise ran out an hour ago.
        PruneRecord(store.blobs, store.namespace, [1], ["a"], grace_s=0, now=lambda: time.time() - 3600)
        store.forget_layers("a", [0, 2, 3])
        # One running now, that dropped b's layer 3 and waits its grace.
        live = PruneRecord(store.blobs, store.namespace, [0, 1, 2], ["b"], grace_s=30)
        store.forget_layers("b", [3])
        _start_a_server(store_root)
        assert (_arrays(store, "a"), _arrays(store, "b")) == ([1], [0, 1, 2, 3])
        assert [s.key for s in scheduled(store.blobs, store.namespace)] == [live.key]
        live.remove()
        _start_a_server(store_root)
        assert _arrays(store, "b") == [0, 1, 2]
        assert unpublished(store.blobs, store.namespace) == {}


def test_a_sweep_leaves_nothing_unpublished(store_root: str) -> None:
    with _open(store_root, "float8_e4m3fn") as store:
        store.write("a", np.arange(T), 5, {0: LAYERS[0], 1: LAYERS[1]})
        served = _read(store, "a", [0])
        store.forget_layers("a", [1])  # its layer and scales arrays, listed no more
        prompt = f"{store.namespace}/prompts/a"
        store.blobs.put(f"{prompt}/scales/7/zarr.json", b"{}")  # a write killed before its layer's
        if isinstance(store.blobs, LocalBlobs):
            # A local write killed between its write and its rename leaves `<name>.<uuid>.tmp`: in each
            # directory a server writes a group's zarr.json to (the layers group's is 63 bytes).
            for where in (store.namespace, f"{store.namespace}/prompts", prompt, f"{prompt}/layers"):
                (store.blobs.root / where / f"zarr.json.{uuid.uuid4().hex}.tmp").write_bytes(group_json())
        left = unpublished(store.blobs, store.namespace)
        assert len(left) >= (8 if isinstance(store.blobs, LocalBlobs) else 4), left
        _start_a_server(store_root, "float8_e4m3fn", grace_s=3600)
        assert unpublished(store.blobs, store.namespace) == left  # young: maybe another server's live write
        _start_a_server(store_root, "float8_e4m3fn", grace_s=0)
        assert unpublished(store.blobs, store.namespace) == {}
        assert _read(store, "a", [0]) == served
