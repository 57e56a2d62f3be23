"""An FP8 store (`--store-dtype float8_e4m3fn`): each layer as float8_e4m3fn with one float32 scale per
token, checked against the exact values and an independent quantizer (ml_dtypes), on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
import torch
import zarr

from cache_server.api.pieces_body import pieces_body
from cache_server.client.pieces import decode_pieces
from cache_server.store.errors import StoreCorrupt, StoreInputError
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.ram_cache import RamCache

H = 64
T = 50
LAYERS = (0, 3, 5)


def activations(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of very different magnitudes (1e-3 to 1e3), an outlier channel, and one all-zero row."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(T, H, generator=g) * torch.logspace(-3, 3, T)[:, None]
    t[:, 7] *= 40
    t[5] = 0
    return t.to(dtype)


def open_fp8(root: str, dtype: torch.dtype, **kw: object) -> HiddenStore:
    store = HiddenStore(
        root, fingerprint="fp8", model_name="tiny", hidden_size=H, dtype=dtype, storage="float8_e4m3fn", **kw
    )  # type: ignore[arg-type]
    store.swept.result()
    return store


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def written(request: pytest.FixtureRequest, store_root: str) -> Iterator[tuple[HiddenStore, dict[int, torch.Tensor]]]:
    dtype = request.param
    layers = {k: activations(k, dtype) for k in LAYERS}
    with open_fp8(store_root, dtype) as store:
        store.write("p", np.arange(T), 10, layers)
        yield store, layers


def test_stored_bytes_and_scales_are_an_independent_quantizers(
    written: tuple[HiddenStore, dict[int, torch.Tensor]],
) -> None:
    store, layers = written
    for k, t in layers.items():
        x = t.float().numpy()
        amax = np.abs(x).max(axis=1)
        want_scales = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
        want_fp8 = np.clip(x / want_scales[:, None], -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        prompt = zarr.open_group(store=store.blobs.zarr_store("fp8/prompts/p"), mode="r")
        np.testing.assert_array_equal(prompt[f"scales/{k}"][:, 0], want_scales)  # exact bytes
        np.testing.assert_array_equal(prompt[f"layers/{k}"][:], want_fp8)
    m = store.manifest("p")
    assert m is not None and m.storage == "float8_e4m3fn" and sorted(m.scale_crc32 or {}) == list(LAYERS)


def test_every_row_is_within_fp8s_error_bound(written: tuple[HiddenStore, dict[int, torch.Tensor]]) -> None:
    store, layers = written
    out = np.empty((T, len(LAYERS) * H), store.numpy_dtype)
    store.read_into("p", list(LAYERS), out)
    got = torch.from_numpy(out.view(np.uint16 if out.itemsize == 2 else np.float32))
    got = (got.view(torch.bfloat16) if out.itemsize == 2 else got).float()
    for i, (k, t) in enumerate(layers.items()):
        x, y = t.float(), got[:, i * H : (i + 1) * H]
        scale = x.abs().amax(dim=1, keepdim=True) / 448
        # e4m3: 3 mantissa bits (half an ulp: 2^-4 of the value), subnormal step 2^-9 of the scale;
        # then one rounding to the target dtype (2^-8 relative for bf16).
        bound = x.abs() * (2**-4 + 2**-8 + 2**-20) + scale * 2**-10 * 1.01
        assert bool(((x - y).abs() <= bound).all()), f"layer {k}: max excess {((x - y).abs() - bound).max()}"
        assert bool((y[5] == 0).all())  # the zero row stays zero
        rel = ((x - y).norm(dim=1) / x.norm(dim=1).clamp_min(1e-30))[x.norm(dim=1) > 0]
        assert float(rel.max()) < 0.05  # per row, far from the bound: most values round well inside it


def test_pieces_decode_to_the_safetensors_bytes(written: tuple[HiddenStore, dict[int, torch.Tensor]]) -> None:
    store, _ = written
    m = store.manifest("p")
    assert m is not None
    for layers, start, stop in [(list(LAYERS), 0, T), ([5, 0], 7, 31)]:
        served = np.empty((stop - start, len(layers) * H), store.numpy_dtype)
        store.read_into("p", layers, served, start, stop)
        hidden, token_ids, meta = decode_pieces(pieces_body(store, m, layers, start, stop).joined())
        assert hidden.tobytes() == served.tobytes()
        assert list(token_ids) == list(range(start, stop))
        assert meta["storage"] == "float8_e4m3fn per-token scale"


def test_ram_cached_rows_serve_the_same_bytes(store_root: str) -> None:
    layers = {k: activations(k, torch.bfloat16) for k in LAYERS}
    with open_fp8(store_root, torch.bfloat16, ram_cache=RamCache(1 << 24)) as store:
        store.write("p", np.arange(T), 10, layers)
        m = store.manifest("p")
        assert m is not None
        first, again = (np.empty((T, 2 * H), store.numpy_dtype) for _ in range(2))
        store.read_into("p", [3, 0], first)  # decoded from the objects, and kept
        store.read_into("p", [3, 0], again)  # from RAM
        assert first.tobytes() == again.tobytes()
        hidden, _, _ = decode_pieces(pieces_body(store, m, [3, 0], 0, T).joined())  # raw RAM pieces
        assert hidden.tobytes() == first.tobytes()


def test_an_fp8_and_an_exact_store_never_serve_each_others_prompts(store_root: str) -> None:
    t = activations(1, torch.bfloat16)
    with HiddenStore(store_root, fingerprint="fp8", model_name="tiny", hidden_size=H, dtype=torch.bfloat16) as exact:
        exact.write("p", np.arange(T), 10, {0: t})
    with open_fp8(store_root, torch.bfloat16) as fp8, pytest.raises(StoreCorrupt, match="exact"):
        fp8.manifest("p")  # the same key written by an exact store: refused, never dequantized


def test_non_finite_values_are_refused_before_anything_is_written(store_root: str) -> None:
    t = activations(2, torch.float32)
    t[3, 4] = float("inf")
    with open_fp8(store_root, torch.float32) as store:
        with pytest.raises(StoreInputError, match="non-finite"):
            store.write("p", np.arange(T), 10, {0: t})
        assert store.manifest("p") is None
