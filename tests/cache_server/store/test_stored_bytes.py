"""The bytes a store holds per namespace and layer (`/metrics`' `cache_server_stored_bytes`), against
what the arrays written encode to, on both backends, and through a running server's `/metrics`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import torch

from cache_server.store import chunks, fp8
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.usage import StoredBytesScan, stored_bytes
from cache_server.torch_utils import as_numpy
from tests.cache_server.helpers import app_client, register_ready

H, T = 32, 30


def _array_bytes(data: np.ndarray, *, compress: bool) -> int:
    meta, encoded = chunks.array_objects(data, compress=compress)
    return len(meta) + sum(map(len, encoded))


def test_stored_bytes_count_each_layers_arrays_per_namespace(store_root: str) -> None:
    layers = {k: torch.randn(T, H).to(torch.bfloat16) for k in (0, 2)}
    expected: dict[tuple[str, str], int] = {}
    for name, storage in (("exact-ns", "exact"), ("fp8-ns", "float8_e4m3fn")):
        with HiddenStore(
            store_root, fingerprint=name, model_name="m", hidden_size=H, dtype=torch.bfloat16, storage=storage
        ) as store:  # type: ignore[arg-type]
            for pid in ("a", "b"):
                store.write(pid, np.arange(T), 5, layers)
            blobs = store.blobs
        for k, t in layers.items():
            if storage == "exact":
                one = _array_bytes(as_numpy(t).view(np.uint16), compress=True)
            else:
                q, scales = fp8.quantize(k, t)
                one = _array_bytes(q, compress=True) + _array_bytes(scales, compress=False)
            expected[name, str(k)] = 2 * one
    found = stored_bytes(blobs)
    assert {key: n for key, n in found.items() if key[1] != "none"} == expected
    assert found["exact-ns", "none"] > 0 and found["fp8-ns", "none"] > 0  # token ids, manifests, groups


def test_a_scan_runs_in_the_background_and_is_served_until_the_next(tmp_path: Path) -> None:
    with HiddenStore(tmp_path, fingerprint="ns", model_name="m", hidden_size=H, dtype=torch.float32) as store:
        scan = StoredBytesScan(store.blobs, refresh_s=3600)
        deadline = time.monotonic() + 10
        while (first := scan.latest()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first is not None and ("ns", "0") not in first
        store.write("a", np.arange(T), 5, {0: torch.randn(T, H)})
        assert scan.latest() == first  # not due for an hour: the last scan stands


def test_metrics_report_the_stored_bytes_of_each_layer(tiny_target: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store, capture_layers="1,4", stored_bytes_refresh_s=0) as client:
        register_ready(client, [{"token_ids": list(range(3, 40))}, {"token_ids": list(range(50, 90))}], layer=1)
        on_disk = {
            k: sum(f.stat().st_size for f in store.glob(f"*/prompts/*/layers/{k}/**/*") if f.is_file()) for k in (1, 4)
        }
        (namespace,) = [p.name for p in store.iterdir() if p.is_dir()]
        deadline, served = time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            text = client.get("/metrics").text
            served = {
                int(k): int(float(v))
                for k, ns, v in re.findall(r'cache_server_stored_bytes\{layer="(\d+)",namespace="(\w+)"\} (\S+)', text)
                if ns == namespace
            }
            if served == on_disk:
                break
            time.sleep(0.05)
        assert served == on_disk and all(on_disk.values())
