from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr.codecs import BloscCodec
from zarr.core.metadata import ArrayV3Metadata

from cache_server.store import blosc_reader, publish
from cache_server.store import chunks as arrays
from cache_server.store.blobs import Blobs, LocalBlobs
from cache_server.store.errors import LayersNotStored, PromptNotStored, StoreCorrupt, StoreError, StoreInputError
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.layers import LAYER_CONVENTION
from testing.tensors import as_numpy, as_tensor

H = 16
T = 40
OpenStore = Callable[..., HiddenStore]


@pytest.fixture
def open_store(store_root: str) -> Iterator[OpenStore]:
    """Opens stores at one location: a local directory, then a prefix of an S3 bucket (moto)."""
    opened: list[HiddenStore] = []

    def _open(fingerprint: str = "fp0", dtype: torch.dtype = torch.bfloat16, **kw: object) -> HiddenStore:
        store = HiddenStore(
            store_root,
            fingerprint=fingerprint,
            model_name="tiny",
            hidden_size=H,
            dtype=dtype,
            **kw,  # type: ignore[arg-type]
        )
        opened.append(store)
        store.swept.result()  # the orphan sweep runs in the background: let it finish
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """16-token chunks, so a 40-token prompt spans three chunks and ranges cross boundaries."""
    monkeypatch.setattr(arrays, "CHUNK_TOKENS", 16)


def make_layer(seed: int, dtype: torch.dtype, tokens: int = T) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(tokens, H, generator=g) * 3).to(dtype)
    if dtype != torch.float32 or seed % 2 == 0:
        specials = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 0.0], dtype=dtype)
        t[0, : len(specials)] = specials
    return t


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def read(store: HiddenStore, prompt_id: str, layers: list[int], start: int = 0, stop: int = T) -> torch.Tensor:
    out = np.empty((stop - start, len(layers) * H), dtype=store.numpy_dtype)
    store.read_into(prompt_id, layers, out, start, stop)
    return as_tensor(out)


TOKENS = np.arange(100, 100 + T)


def published(store: HiddenStore) -> list[PromptManifest]:
    """Every prompt a reader can see, by id."""
    found = [store.manifest(p) for p in store.blobs.children(f"{store.namespace}/prompts")]
    return [m for m in found if m is not None]


def prompt_group(store: HiddenStore, prompt_id: str) -> dict[str, object]:
    raw = store.blobs.get(f"{store.namespace}/prompts/{prompt_id}/zarr.json")
    assert raw is not None
    return json.loads(raw)  # type: ignore[no-any-return]


def layer_key(store: HiddenStore, prompt_id: str, layer: int) -> str:
    return f"{store.namespace}/prompts/{prompt_id}/layers/{layer}"


def chunk_of(store: HiddenStore, prompt_id: str, layer: int, chunk: int) -> str:
    return arrays.chunk_key(layer_key(store, prompt_id, layer), chunk, 2)


def layout(blobs: Blobs, key: str) -> blosc_reader.BloscChunks | None:
    raw = blobs.get(f"{key}/zarr.json")
    assert raw is not None
    return blosc_reader.blosc_chunks(ArrayV3Metadata.from_dict(json.loads(raw)), blobs, key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bit_exact(open_store: OpenStore, small_chunks: None, dtype: torch.dtype) -> None:
    store = open_store(dtype=dtype)
    layers = {k: make_layer(k, dtype) for k in (0, 3, 7)}
    store.write("p1", TOKENS, 10, layers)
    got = read(store, "p1", [0, 3, 7])
    assert got.dtype == dtype
    for i, k in enumerate((0, 3, 7)):
        assert torch.equal(bits(got[:, i * H : (i + 1) * H]), bits(layers[k]))
    np.testing.assert_array_equal(store.token_ids("p1"), TOKENS)
    assert store.token_ids("p1").dtype == np.int64


def test_request_order_and_ranges(open_store: OpenStore, small_chunks: None) -> None:
    store = open_store()
    layers = {k: make_layer(k, torch.bfloat16) for k in (1, 3, 5)}
    store.write("p1", TOKENS, 10, layers)
    order = [5, 1, 3]
    for start, stop in [(0, T), (0, 1), (15, 17), (16, 32), (5, 39), (39, 40)]:
        got = read(store, "p1", order, start, stop)
        want = torch.cat([layers[k][start:stop] for k in order], dim=1)
        assert torch.equal(bits(got), bits(want)), (start, stop)
    # stop=None means "to the end"; an empty range touches nothing.
    out = np.empty((T - 30, 2 * H), dtype=store.numpy_dtype)
    store.read_into("p1", [3, 3], out, start=30)
    assert torch.equal(bits(as_tensor(out)[:, H:]), bits(layers[3][30:]))
    store.read_into("p1", [1], np.empty((0, H), dtype=store.numpy_dtype), 7, 7)


def test_read_into_a_column_view_of_a_bigger_buffer(open_store: OpenStore) -> None:
    store = open_store()
    layers = {k: make_layer(k, torch.bfloat16) for k in (2, 4)}
    store.write("p1", TOKENS, 10, layers)
    buf = np.zeros((T, 4 * H), dtype=store.numpy_dtype)
    store.read_into("p1", [4, 2], buf[:, H : 3 * H])
    got = as_tensor(buf)
    assert torch.equal(bits(got[:, H : 2 * H]), bits(layers[4]))
    assert torch.equal(bits(got[:, 2 * H : 3 * H]), bits(layers[2]))
    assert not got[:, :H].any() and not got[:, 3 * H :].any()


def test_manifest_fields(open_store: OpenStore) -> None:
    store = open_store()
    m = store.write(
        "p1",
        TOKENS.astype(np.int32),
        12,
        {7: make_layer(7, torch.bfloat16), 2: make_layer(2, torch.bfloat16)},
    )
    assert m.prompt_id == "p1"
    assert (m.model_fingerprint, m.model_name, m.dtype) == ("fp0", "tiny", "bfloat16")
    assert m.layer_convention == LAYER_CONVENTION
    assert m.layers == (2, 7)
    assert (m.prompt_len, m.num_tokens, m.hidden_size) == (12, T, H)
    assert m.token_sha256 == hashlib.sha256(TOKENS.astype("<i8").tobytes()).hexdigest()
    assert "zstd" in m.codec
    assert datetime.fromisoformat(m.created_at).tzinfo is not None
    group = prompt_group(store, "p1")
    on_disk = group["attributes"]["manifest"]  # type: ignore[index]
    assert group["node_type"] == "group"
    assert on_disk["layers"] == [2, 7] and on_disk["token_sha256"] == m.token_sha256
    assert store.manifest("p1") == m
    assert published(store) == [m]
    assert store.manifest("nope") is None
    assert store.namespace == "fp0"
    assert sorted(m.layer_crc32 or {}) == [2, 7]
    # The fields a server from before storages existed reads (its manifest forbids any other): an exact
    # store's manifest keeps to them, so old and new servers can share it during an upgrade.
    before_storages = {
        "prompt_id", "model_fingerprint", "model_name", "dtype", "layer_convention", "layers", "prompt_len",
        "num_tokens", "hidden_size", "token_sha256", "codec", "created_at", "greedy_mismatches", "generator",
        "layer_crc32",
    }  # fmt: skip
    assert set(on_disk) == before_storages


def test_adding_layers_keeps_old_ones(open_store: OpenStore, small_chunks: None) -> None:
    store = open_store()
    first = store.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    # Layer 3 is already stored: the new tensor given for it is ignored, layer 1 is added.
    second = store.write("p1", TOKENS, 10, {1: make_layer(1, torch.bfloat16), 3: make_layer(99, torch.bfloat16)})
    assert second.layers == (1, 3)
    assert second.created_at == first.created_at
    assert torch.equal(bits(read(store, "p1", [3])), bits(make_layer(3, torch.bfloat16)))
    assert torch.equal(bits(read(store, "p1", [1])), bits(make_layer(1, torch.bfloat16)))
    assert store.write("p1", TOKENS, 10, {1: make_layer(1, torch.bfloat16)}) == second
    assert prompt_group(store, "p1")["attributes"]["manifest"]["layers"] == [1, 3]  # type: ignore[index]


def test_add_with_other_tokens_or_prompt_len_raises(open_store: OpenStore) -> None:
    store = open_store()
    store.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    other = TOKENS.copy()
    other[-1] += 1
    with pytest.raises(StoreError, match="other token ids"):
        store.write("p1", other, 10, {1: make_layer(1, torch.bfloat16)})
    with pytest.raises(StoreInputError):
        store.write("p1", TOKENS, 11, {1: make_layer(1, torch.bfloat16)})
    assert store.manifest("p1").layers == (3,)  # type: ignore[union-attr]


def test_other_fingerprint_sees_nothing(open_store: OpenStore) -> None:
    a = open_store("model-a")
    a.write("p1", TOKENS, 10, {0: make_layer(0, torch.bfloat16)})
    b = open_store("model-b")
    assert b.manifest("p1") is None
    assert published(b) == []
    with pytest.raises(PromptNotStored):
        b.read_into("p1", [0], np.empty((T, H), dtype=b.numpy_dtype))


def test_unknown_layers_raise_naming_them(open_store: OpenStore) -> None:
    store = open_store()
    store.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    with pytest.raises(LayersNotStored, match=r"\[2, 9\]") as info:
        store.read_into("p1", [9, 3, 2], np.empty((T, 3 * H), dtype=store.numpy_dtype))
    assert info.value.missing == (2, 9)


def test_bad_inputs_are_rejected(open_store: OpenStore) -> None:
    store = open_store()
    good = make_layer(0, torch.bfloat16)
    cases: list[tuple[str, np.ndarray, int, dict[int, torch.Tensor], str]] = [
        ("p1", TOKENS, 10, {0: good.float()}, "bfloat16"),
        ("p1", TOKENS, 10, {0: good[:-1]}, r"\[40, 16\]"),
        ("p1", TOKENS, 0, {0: good}, "prompt_len"),
        ("p1", TOKENS.astype(np.float32), 10, {0: good}, "token_ids"),
        ("p1", TOKENS, 10, {-1: good}, "layer ids"),
        ("p1", TOKENS, 10, {}, "at least one layer"),
        ("../evil", TOKENS, 10, {0: good}, "prompt id"),
    ]
    for prompt_id, tokens, prompt_len, layers, message in cases:
        with pytest.raises(StoreInputError, match=message):
            store.write(prompt_id, tokens, prompt_len, layers)
    assert published(store) == []
    store.write("p1", TOKENS, 10, {0: good})
    with pytest.raises(StoreInputError, match="shape"):
        store.read_into("p1", [0], np.empty((T, 2 * H), dtype=store.numpy_dtype))
    with pytest.raises(StoreInputError, match="shape"):
        store.read_into("p1", [0], np.empty((T, H), dtype=np.float32))
    with pytest.raises(StoreInputError, match="outside"):
        store.read_into("p1", [0], np.empty((5, H), dtype=store.numpy_dtype), T - 2, T + 3)


def leave_interrupted_writes(store: HiddenStore) -> None:
    """What a kill leaves: the old layout's staging dir, a prompt whose manifest never came, a layer
    written before the manifest listing it, a manifest temp file."""
    ns, blobs = store.namespace, store.blobs
    blobs.put(f"{ns}/tmp/dead/layers/0/zarr.json.abc.partial", b"{")
    publish.write_array(blobs, f"{ns}/prompts/p2/layers/0", np.zeros((T, H), np.uint16), compress=True)
    publish.write_array(blobs, f"{ns}/prompts/p1/layers/5", np.ones((T, H), np.uint16), compress=True)
    blobs.put(f"{ns}/prompts/p1/zarr.json.123.tmp", b"{")


def test_interrupted_writes_are_never_served_and_removed_once_stale(open_store: OpenStore) -> None:
    store = open_store()
    store.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    leave_interrupted_writes(store)
    ns, blobs = store.namespace, store.blobs
    # Within the grace period they may be another server's live write: invisible, and kept.
    store = open_store(orphan_grace_s=3600)
    assert [m.prompt_id for m in published(store)] == ["p1"]
    assert store.manifest("p2") is None
    with pytest.raises(LayersNotStored):
        store.read_into("p1", [5], np.empty((T, H), dtype=store.numpy_dtype))
    assert blobs.children(f"{ns}/prompts/p1/layers") == ["3", "5"]
    assert blobs.get(f"{ns}/prompts/p1/zarr.json.123.tmp") is not None
    # Older than the grace period: orphans, removed.
    store = open_store(orphan_grace_s=0)
    assert blobs.children(f"{ns}/prompts") == ["p1"]
    assert blobs.children(f"{ns}/prompts/p1/layers") == ["3"]
    # Only local writes leave temporary files (written aside, renamed): an S3 store is not listed for them.
    local = isinstance(blobs, LocalBlobs)
    assert (blobs.get(f"{ns}/prompts/p1/zarr.json.123.tmp") is None) == local
    assert list(blobs.objects(f"{ns}/tmp")) == []
    # The caller recomputes; both writes now succeed.
    store.write("p1", TOKENS, 10, {5: make_layer(5, torch.bfloat16)})
    store.write("p2", TOKENS, 10, {0: make_layer(0, torch.bfloat16)})
    assert torch.equal(bits(read(store, "p1", [5])), bits(make_layer(5, torch.bfloat16)))


def test_a_write_over_leftovers_replaces_them(open_store: OpenStore, small_chunks: None) -> None:
    store = open_store()
    store.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    leave_interrupted_writes(store)
    # A leftover chunk beyond the new array's end must not survive either.
    store.blobs.put(chunk_of(store, "p2", 0, 7), b"stale")
    store.write("p1", TOKENS, 10, {5: make_layer(5, torch.bfloat16)})
    store.write("p2", TOKENS, 10, {0: make_layer(0, torch.bfloat16)})
    assert torch.equal(
        bits(read(store, "p1", [5, 3])), bits(torch.cat([make_layer(k, torch.bfloat16) for k in (5, 3)], 1))
    )
    assert torch.equal(bits(read(store, "p2", [0])), bits(make_layer(0, torch.bfloat16)))
    assert store.blobs.get(chunk_of(store, "p2", 0, 7)) is None


@pytest.mark.parametrize("fails", ["a chunk", "an array's zarr.json", "the manifest"])
def test_failed_publish_leaves_nothing_visible(
    open_store: OpenStore, small_chunks: None, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    store = open_store()
    put = store.blobs.put
    suffix = {
        "a chunk": "/layers/0/c/1/0",
        "an array's zarr.json": "/layers/0/zarr.json",
        "the manifest": "/p1/zarr.json",
    }[fails]

    def crash(key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        if key.endswith(suffix):
            raise OSError("disk full")
        put(key, data, create=create)

    monkeypatch.setattr(store.blobs, "put", crash)
    with pytest.raises(OSError, match="disk full"):
        store.write("p1", TOKENS, 10, {0: make_layer(0, torch.bfloat16)})
    assert store.manifest("p1") is None
    with pytest.raises(PromptNotStored):
        store.token_ids("p1")
    monkeypatch.undo()
    store.write("p1", TOKENS, 10, {0: make_layer(0, torch.bfloat16)})
    assert store.manifest("p1").layers == (0,)  # type: ignore[union-attr]
    assert torch.equal(bits(read(store, "p1", [0])), bits(make_layer(0, torch.bfloat16)))


def test_missing_chunk_is_corruption_not_zeros(open_store: OpenStore, small_chunks: None) -> None:
    store = open_store()
    zeros = torch.zeros(T, H, dtype=torch.bfloat16)
    store.write("p1", TOKENS, 10, {0: zeros, 1: make_layer(1, torch.bfloat16)})
    assert torch.equal(bits(read(store, "p1", [0])), bits(zeros))  # all-zero chunks are still written
    store.blobs.delete(chunk_of(store, "p1", 1, 1))
    read(store, "p1", [1], 0, 16)  # chunk 0 is intact
    with pytest.raises(StoreCorrupt, match="chunk 1"):
        read(store, "p1", [0, 1], 10, 20)


def test_chunks_overwritten_after_publishing_fail_their_checksums(open_store: OpenStore, small_chunks: None) -> None:
    """What a writer whose capture lease was taken over could do: replace published objects with its
    own valid ones. Readers refuse them instead of serving a mix."""
    store = open_store()
    store.write("p1", TOKENS, 10, {0: make_layer(0, torch.bfloat16), 1: make_layer(1, torch.bfloat16)})
    # A valid chunk of the same size from another capture of the same shape.
    _, other = arrays.array_objects(as_numpy(make_layer(7, torch.bfloat16)).view(np.uint16), compress=True)
    store.blobs.put(chunk_of(store, "p1", 1, 0), other[0])
    with pytest.raises(StoreCorrupt, match=r"layer 1: chunk 0\b.* does not match its checksum"):
        read(store, "p1", [0, 1])
    # The layer's metadata rewritten with checksums to match: the manifest's checksum catches it.
    meta, _ = arrays.array_objects(as_numpy(make_layer(7, torch.bfloat16)).view(np.uint16), compress=True)
    store.blobs.put(f"{layer_key(store, 'p1', 0)}/zarr.json", meta)
    fresh = open_store()
    with pytest.raises(StoreCorrupt, match=r"layer 0: its zarr\.json does not match the manifest.s checksum"):
        read(fresh, "p1", [0])


def test_many_stores_share_a_namespace(open_store: OpenStore) -> None:
    """Servers on one store: what one publishes, another reads, including layers added later."""
    a, b = open_store(), open_store()
    a.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    assert torch.equal(bits(read(b, "p1", [3])), bits(make_layer(3, torch.bfloat16)))
    b.write("p1", TOKENS, 10, {1: make_layer(1, torch.bfloat16)})
    assert torch.equal(bits(read(a, "p1", [1, 3])), bits(torch.cat([make_layer(k, torch.bfloat16) for k in (1, 3)], 1)))
    assert a.manifest("p1") == b.manifest("p1")


# -- the direct chunk reader (blosc_reader.ChunkReader) against zarr ------------------------------------

RANGES = [(0, T), (0, 1), (15, 17), (16, 32), (5, 39), (39, 40), (31, 33)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_direct_chunk_reads_match_zarr(
    open_store: OpenStore, small_chunks: None, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    store = open_store(dtype=dtype)
    layers = {k: make_layer(k, dtype) for k in (1, 3, 5)}
    store.write("p1", TOKENS, 10, layers)
    chunks = layout(store.blobs, layer_key(store, "p1", 1))
    assert (
        chunks is not None and chunks.chunk_rows == 16 and chunks.crc32 is not None
    )  # the direct path is the one under test
    # One layer decodes full chunks straight into `out`; several go through a scratch into column slices.
    requests = [[5, 1, 3], [3], [1, 1]]
    direct = {(tuple(ks), r): read(store, "p1", ks, *r) for ks in requests for r in RANGES}
    store.close()
    monkeypatch.setattr(blosc_reader, "blosc_chunks", lambda md, blobs, array: None)
    via_zarr = open_store(dtype=dtype)
    for (ks, (start, stop)), got in direct.items():
        want = torch.cat([layers[k][start:stop] for k in ks], dim=1)
        assert torch.equal(bits(got), bits(want)), (ks, start, stop)
        assert torch.equal(bits(read(via_zarr, "p1", list(ks), start, stop)), bits(got)), (ks, start, stop)


def test_other_array_layouts_are_read_through_zarr(open_store: OpenStore, small_chunks: None) -> None:
    store = open_store()
    data = make_layer(0, torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    publish.write_array(store.blobs, "ours", data, compress=True)
    publish.write_array(store.blobs, "raw", data, compress=False)
    assert layout(store.blobs, "ours") is not None
    assert layout(store.blobs, "raw") is None
    # A layer someone rewrote with another codec and chunk key encoding still reads back exactly.
    layers = {k: make_layer(k, torch.bfloat16) for k in (0, 1)}
    store.write("p1", TOKENS, 10, layers)
    other = layer_key(store, "p1", 1)
    store.blobs.delete(other)
    zarr.create_array(
        store=store.blobs.zarr_store(other, read_only=False),
        data=as_numpy(layers[1]).view(np.uint16),
        chunks=(8, H),
        compressors=BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),
        chunk_key_encoding={"name": "default", "separator": "."},
        zarr_format=3,
    )
    assert layout(store.blobs, other) is None
    store = open_store()  # the manifest's checksum of layer 1's zarr.json no longer holds: drop it
    m = store.manifest("p1")
    assert m is not None and m.layer_crc32 is not None
    store.blobs.put(
        f"{store.namespace}/prompts/p1/zarr.json",
        json.dumps(
            {
                "zarr_format": 3,
                "node_type": "group",
                "attributes": {"manifest": {**m.model_dump(mode="json"), "layer_crc32": {"0": m.layer_crc32[0]}}},
            }
        ).encode(),
    )
    store = open_store()
    for start, stop in RANGES:
        want = torch.cat([layers[k][start:stop] for k in (1, 0)], dim=1)
        assert torch.equal(bits(read(store, "p1", [1, 0], start, stop)), bits(want)), (start, stop)


@pytest.mark.parametrize("damage", ["truncated", "empty", "other width", "bad header"])
def test_damaged_chunk_is_corruption_not_garbage(open_store: OpenStore, small_chunks: None, damage: str) -> None:
    store = open_store()
    store.write("p1", TOKENS, 10, {0: make_layer(0, torch.bfloat16), 1: make_layer(1, torch.bfloat16)})
    chunk = chunk_of(store, "p1", 1, 1)
    payload = store.blobs.get(chunk)
    assert payload is not None
    if damage == "truncated":
        store.blobs.put(chunk, payload[:-1])
    elif damage == "empty":
        store.blobs.put(chunk, b"")
    elif damage == "other width":  # a whole, valid chunk of the wrong size
        store.blobs.put(chunk, arrays.array_objects(np.ones((16, 2 * H), dtype=np.uint16), compress=True)[1][0])
    else:
        store.blobs.put(chunk, payload[:16] + bytes(len(payload) - 16))  # header intact, blocks zeroed
    read(store, "p1", [1], 0, 16)  # chunk 0 is intact
    for layers in ([1], [0, 1]):
        with pytest.raises(
            StoreCorrupt,
            match=r"layer 1: chunk 1\b.*(is damaged|is truncated|does not decode|does not match its checksum)",
        ):
            read(store, "p1", layers, 10, 20)


@pytest.mark.parametrize("kind", ["activations", "incompressible"])
def test_a_row_range_decodes_only_its_blocks_and_reads_exactly(tmp_path: Path, kind: str) -> None:
    """Chunks of 4 Blosc blocks (1024 rows x 2048 bf16 = 4 MiB): any range reads back exactly, from the
    blocks that hold it; incompressible data is stored as is (MEMCPYED) and sliced."""
    rows, width = 1500, 2048  # two chunks, the second padded
    rng = np.random.default_rng(0)
    if kind == "activations":
        data = as_numpy(torch.from_numpy(rng.standard_normal((rows, width), np.float32)).to(torch.bfloat16))
        data = data.view(np.uint16)
    else:
        data = rng.integers(0, 1 << 16, (rows, width), dtype=np.uint16)
    blobs = LocalBlobs(tmp_path)
    publish.write_array(blobs, "a", data, compress=True)
    chunks = layout(blobs, "a")
    assert chunks is not None
    reader = blosc_reader.ChunkReader()
    for start, stop in [(0, 1), (5, 133), (500, 530), (1000, 1100), (1023, 1025), (1490, 1500), (0, 1500)]:
        out = np.empty((stop - start, width), np.uint16)
        for c, lo, hi, at in chunks.pieces(start, stop):
            reader.read(chunks, c, lo, hi, out[at : at + hi - lo])
        assert np.array_equal(out, data[start:stop]), (kind, start, stop)
    flags = (blobs.get(arrays.chunk_key("a", 0, 2)) or b"")[2]
    assert bool(flags & 0x02) == (kind == "incompressible")


def test_a_damaged_block_table_is_an_error_not_garbage(tmp_path: Path) -> None:
    data = as_numpy(torch.randn(1024, 2048).to(torch.bfloat16)).view(np.uint16)
    blobs = LocalBlobs(tmp_path)
    publish.write_array(blobs, "a", data, compress=True)
    raw = bytearray(blobs.get(arrays.chunk_key("a", 0, 2)) or b"")
    raw[16:20] = (10**9).to_bytes(4, "little")  # the first block's offset points past the chunk
    blobs.put(arrays.chunk_key("a", 0, 2), bytes(raw))
    chunks = layout(blobs, "a")
    assert chunks is not None
    with pytest.raises(ValueError, match="block table"):
        blosc_reader.ChunkReader().read(chunks, 0, 0, 10, np.empty((10, 2048), np.uint16))


def test_plain_zarr_browses_the_store(open_store: OpenStore) -> None:
    store = open_store()
    layers = {k: make_layer(k, torch.bfloat16) for k in (1, 4)}
    m = store.write("p1", TOKENS, 10, layers)
    root = zarr.open_group(store=store.blobs.zarr_store(store.namespace), mode="r")
    assert root.attrs["hidden_state_cache"]["fingerprint"] == "fp0"
    assert root.attrs["hidden_state_cache"]["layer_convention"] == LAYER_CONVENTION
    prompt = root["prompts/p1"]
    assert prompt.attrs["manifest"]["layers"] == [1, 4] and prompt.attrs["manifest"] == m.as_written()
    assert prompt["token_ids"][:].tolist() == TOKENS.tolist()
    stored = prompt["layers/4"][:]  # bf16 is kept as its uint16 bit pattern (zarr has no bfloat16)
    assert np.array_equal(stored, as_numpy(layers[4]).view(np.uint16))
    assert sorted(root["prompts/p1/layers"].array_keys()) == ["1", "4"]


def test_a_store_written_before_the_hierarchy_is_read_and_migrated(open_store: OpenStore) -> None:
    store = open_store()
    layers = {k: make_layer(k, torch.bfloat16) for k in (0, 2)}
    m = store.write("p1", TOKENS, 10, layers)
    blobs, ns = store.blobs, store.namespace
    prompt = f"{ns}/prompts/p1"
    # The older layout: the manifest in manifest.json, no group metadata anywhere, no checksums.
    blobs.put(f"{prompt}/manifest.json", m.model_copy(update={"layer_crc32": None}).model_dump_json(indent=1).encode())
    for group in (prompt, f"{prompt}/layers", f"{ns}/prompts", ns):
        blobs.delete(f"{group}/zarr.json")
    store = open_store()
    assert store.manifest("p1") == m.model_copy(update={"layer_crc32": None})
    assert torch.equal(bits(read(store, "p1", [2, 0])), bits(torch.cat([layers[2], layers[0]], dim=1)))
    assert blobs.get(f"{prompt}/manifest.json") is None  # migrated on open
    root = zarr.open_group(store=blobs.zarr_store(ns), mode="r")
    assert root["prompts/p1"].attrs["manifest"]["layers"] == [0, 2]


def test_a_new_prompt_is_published_once(open_store: OpenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers that both took a prompt for new (the race capture leases prevent, unless one was
    lost): the second's manifest is refused; arrays it overwrote are caught by their checksums."""
    a, b = open_store(), open_store()
    first = a.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})
    monkeypatch.setattr(b, "manifest", lambda prompt_id, fresh=False: None)
    with pytest.raises(StoreError, match="published by another writer"):
        b.write("p1", TOKENS, 10, {3: make_layer(3, torch.bfloat16)})  # the same capture: same bytes
    assert open_store().manifest("p1") == first
    assert torch.equal(bits(read(open_store(), "p1", [3])), bits(make_layer(3, torch.bfloat16)))
    with pytest.raises(StoreError, match="published by another writer"):
        b.write("p1", TOKENS, 10, {3: make_layer(99, torch.bfloat16)})  # other bytes under the same keys
    with pytest.raises(StoreCorrupt, match="checksum"):
        read(open_store(), "p1", [3])


# rows x width x dtype: one chunk with a shorter last block, one below a block, whole blocks then a
# shorter one over several chunks (the last padded), incompressible data stored as is.
RANGE_SHAPES = [
    (756, 512, torch.float32),
    (37, 640, torch.bfloat16),
    (900, 5120, torch.bfloat16),
    (1500, 640, torch.float32),
    (2051, 1536, torch.float16),
    (300, 2560, "noise"),
]


@pytest.mark.parametrize("storage", ["exact", "float8_e4m3fn"])
@pytest.mark.parametrize(("rows", "width", "kind"), RANGE_SHAPES, ids=lambda v: str(v).removeprefix("torch."))
def test_every_row_range_reads_what_the_whole_prompt_holds(
    store_root: str, rows: int, width: int, kind: torch.dtype | str, storage: str
) -> None:
    """Ranges on each side of every Blosc block boundary and inside each chunk's last, shorter block,
    decoded by the store (safetensors bodies) and as pieces (decoded by the client), equal the rows of
    a whole-prompt read."""
    from cache_server.api.pieces_body import pieces_body
    from cache_server.client.pieces import decode_pieces

    dtype = torch.bfloat16 if kind == "noise" else kind
    g = torch.Generator().manual_seed(rows)
    if kind == "noise" and storage == "exact":  # incompressible bits: the chunk is stored as is
        layer = torch.randint(-(2**15), 2**15, (rows, width), generator=g, dtype=torch.int16).view(torch.bfloat16)
    else:  # (FP8 keeps only finite values; its bytes of wide-ranging values compress little)
        layer = (torch.randn(rows, width, generator=g) * (1e3 if kind == "noise" else 1)).to(dtype)
    store = HiddenStore(
        store_root, fingerprint="ranges", model_name="t", hidden_size=width, dtype=dtype, storage=storage
    )  # type: ignore[arg-type]
    try:
        manifest = store.write("p", np.arange(rows), 1, {0: layer, 1: layer.flip(0)})
        whole = read_whole(store, rows, width)
        stored_element = 1 if storage == "float8_e4m3fn" else layer.element_size()  # FP8: one byte each
        row_bytes, block = width * stored_element, arrays.BLOSC_BLOCKSIZE
        chunk_rows = min(arrays.CHUNK_TOKENS, rows)
        edges = {0, rows}
        for c0 in range(0, rows, chunk_rows):  # block boundaries inside each chunk, and its end
            chunk_end = min(c0 + chunk_rows, rows)
            edges |= {c0 + k * block // row_bytes for k in range(1, chunk_rows * row_bytes // block + 1)} | {chunk_end}
        edges = {e for e in edges if e <= rows}  # the last chunk is padded: its blocks run past the prompt
        ranges = {(max(e - 1, 0), min(e + 1, rows)) for e in edges}
        ranges |= {(e, min(e + 3, rows)) for e in edges if e < rows} | {(max(e - 3, 0), e) for e in edges if e > 0}
        ranges |= {(rows - 1, rows), (rows // 2, rows), (0, rows)}
        for start, stop in sorted(r for r in ranges if r[0] < r[1]):
            out = np.empty((stop - start, 2 * width), store.numpy_dtype)
            store.read_into("p", [0, 1], out, start, stop)
            assert np.array_equal(out.view(np.uint8), whole[start:stop].view(np.uint8)), (start, stop)
            body = pieces_body(store, manifest, [0, 1], start, stop).joined()
            hidden, token_ids, _ = decode_pieces(body)
            assert np.array_equal(hidden.view(np.uint8), whole[start:stop].view(np.uint8)), ("pieces", start, stop)
            assert token_ids.tolist() == list(range(start, stop))
    finally:
        store.close()


def read_whole(store: HiddenStore, rows: int, width: int) -> np.ndarray:
    out = np.empty((rows, 2 * width), store.numpy_dtype)
    store.read_into("p", [0, 1], out)
    return out
