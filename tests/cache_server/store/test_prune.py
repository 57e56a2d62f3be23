"""Pruning: manifests first (readers see the old prompt or the new, never half of one), files after the
grace; a reader still holding the old manifest finds the layer not stored, never corrupt. Both backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from cache_server.store.errors import LayersNotStored, StoreInputError
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.prune import open_namespace, prune
from cache_server.torch_utils import as_numpy

H, T = 32, 40
LAYERS = {k: torch.randn(T, H, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16) for k in range(4)}


def _open(root: str, storage: str = "exact") -> HiddenStore:
    return HiddenStore(
        root, fingerprint=f"ns-{storage}", model_name="m", hidden_size=H, dtype=torch.bfloat16, storage=storage
    )  # type: ignore[arg-type]


def _read(store: HiddenStore, pid: str, layers: list[int]) -> bytes:
    out = np.empty((T, len(layers) * H), store.numpy_dtype)
    store.read_into(pid, layers, out)
    return out.tobytes()


@pytest.fixture(params=["exact", "float8_e4m3fn"])
def written(request: pytest.FixtureRequest, store_root: str) -> Iterator[tuple[HiddenStore, HiddenStore]]:
    """A writer that stored prompts a, b, c with layers 0-3, and a second store on the same namespace
    (another server) that has read all of them."""
    with _open(store_root, request.param) as writer, _open(store_root, request.param) as other:
        for pid in "abc":
            writer.write(pid, np.arange(T), 5, LAYERS)
            _read(other, pid, [0, 1, 2, 3])  # its manifests are now cached
        yield writer, other


def test_manifests_drop_first_and_files_go_after_the_grace(written: tuple[HiddenStore, HiddenStore]) -> None:
    writer, other = written
    before = {pid: _read(other, pid, [0, 1, 2, 3]) for pid in "abc"}
    prompts = f"{writer.namespace}/prompts"
    arrays = [f"{prompts}/{pid}/{kind}/{k}" for pid in "ab" for k in (0, 2) for kind in ("layers", "scales")]
    stored = sum(o.size for array in arrays for o in writer.blobs.objects(array))
    during: list[bool] = []

    def grace(seconds: float) -> None:
        assert seconds == 5
        for pid in "ab":
            m = writer.manifest(pid, fresh=True)
            assert m is not None and m.layers == (1, 3)
            assert _read(other, pid, [0, 1, 2, 3]) == before[pid]  # an old manifest still reads whole bytes
        during.append(True)

    result = prune(writer, [1, 3], ["a", "b", "gone"], grace_s=5, sleep=grace)
    assert during == [True]
    assert result.dropped == {"a": (0, 2), "b": (0, 2)} and result.not_stored == ["gone"]
    assert result.bytes_deleted == stored > 0
    for pid in "ab":
        assert not any(writer.blobs.objects(f"{prompts}/{pid}/layers/0"))
        with pytest.raises(LayersNotStored) as e:
            _read(other, pid, [1, 0])  # the old manifest's layer is gone: not stored, to be captured again
        assert e.value.missing == (0,)
        assert _read(other, pid, [3, 1]) == _read(writer, pid, [3, 1])
    m = writer.manifest("c", fresh=True)
    assert m is not None and m.layers == (0, 1, 2, 3)  # not asked for: untouched
    assert _read(writer, "c", [0, 1, 2, 3]) == before["c"]


def test_a_layer_captured_again_during_the_grace_is_kept(written: tuple[HiddenStore, HiddenStore]) -> None:
    writer, other = written
    before = _read(writer, "a", [0])
    result = prune(writer, [1], ["a"], grace_s=0, sleep=lambda _: other.write("a", np.arange(T), 5, {0: LAYERS[0]}))
    assert result.dropped == {"a": (0, 2, 3)}
    m = writer.manifest("a", fresh=True)
    assert m is not None and m.layers == (0, 1)
    assert _read(writer, "a", [0]) == before  # the refilled layer's files were not deleted


def test_concurrent_readers_see_the_old_or_the_new_prompt_never_missing_bytes(
    written: tuple[HiddenStore, HiddenStore],
) -> None:
    writer, other = written
    whole = {k: _read(writer, "a", [k]) for k in range(4)}
    stop, problems, reads = threading.Event(), [], [0, 0]

    def reader(layers: list[int], slot: int) -> None:
        while not stop.is_set():
            try:
                got = _read(other, "a", layers)
                assert got == b"".join(whole[k] for k in layers) or len(layers) > 1  # concatenated per token
                reads[slot] += 1
            except LayersNotStored as e:
                if not set(e.missing) <= {0, 2}:
                    problems.append(e)
            except Exception as e:
                problems.append(e)

    threads = [threading.Thread(target=reader, args=([k], k % 2)) for k in (0, 1, 2, 3)]
    for t in threads:
        t.start()
    try:
        prune(writer, [1, 3], ["a"], grace_s=0.1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not problems, problems[:3]
    assert reads[0] > 0 and reads[1] > 0
    assert _read(other, "a", [1]) == whole[1] and _read(other, "a", [3]) == whole[3]


def test_open_namespace_reads_the_identity_and_names_the_choices(store_root: str) -> None:
    with _open(store_root) as exact:
        exact.write("a", np.arange(T), 5, {0: LAYERS[0]})
        blobs = exact.blobs
    with open_namespace(blobs, None) as found:
        assert (found.namespace, found.storage, found.hidden_size) == ("ns-exact", "exact", H)
        assert _read(found, "a", [0]) == as_numpy(LAYERS[0]).tobytes()
    _open(store_root, "float8_e4m3fn").close()  # a second namespace
    with pytest.raises(StoreInputError, match=r"ns-exact .*ns-float8_e4m3fn"):
        open_namespace(blobs, None)
    with open_namespace(blobs, "ns-float8_e4m3fn") as fp8:
        assert fp8.storage == "float8_e4m3fn"


def test_keeping_nothing_is_refused(written: tuple[HiddenStore, HiddenStore]) -> None:
    with pytest.raises(StoreInputError, match="at least one"):
        prune(written[0], [], grace_s=0)
    m = written[0].manifest("a", fresh=True)
    assert m is not None and m.layers == (0, 1, 2, 3)
