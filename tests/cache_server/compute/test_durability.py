"""Never stale, durable and atomic: fingerprint namespaces, restarts, interrupted writes; on a local
store and on S3 (moto), each with its coordination database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient

from cache_server.store.locations import open_blobs
from tests.cache_server.helpers import app_client, get_hidden, metric, register_ready
from tests.cache_server.reference import direct_layer_outputs


def serve(model: Path, store: str, tmp_path: Path, **kw: Any) -> TestClient:
    """The app on `store`; an S3 store's database is a SQLite file beside the test."""
    db = {"db": str(tmp_path / "coordination.sqlite")} if store.startswith("s3://") else {}
    return app_client(model, store, **db, **kw)  # type: ignore[arg-type]


def published(store: str) -> list[str]:
    """The manifests in the store (one per published prompt)."""
    blobs = open_blobs(store)
    return [
        o.key
        for fp in blobs.children("")
        for o in blobs.objects(f"{fp}/prompts")
        if o.key.endswith("/zarr.json") and o.key.count("/") == 3
    ]


TOKENS = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11, 64, 65]
COMPUTED = "cache_server_prompts_computed_total"


def test_restart_serves_stored_states_without_recomputing(tiny_target: Path, store_root: str, tmp_path: Path) -> None:
    with serve(tiny_target, store_root, tmp_path) as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}])
        before = get_hidden(client, pid, "2,4")[0]["hidden"].clone()
    with serve(tiny_target, store_root, tmp_path) as client:
        assert client.get(f"/prompts/{pid}").json()["status"] == "ready"
        after = get_hidden(client, pid, "2,4")[0]["hidden"]
        assert metric(client, COMPUTED) == 0
    assert torch.equal(before, after)


def test_another_model_or_dtype_never_reads_old_states(
    tiny_target: Path, other_tiny_target: Path, store_root: str, tmp_path: Path
) -> None:
    with serve(tiny_target, store_root, tmp_path) as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}])
        fp_a = client.get("/model").json()["fingerprint"]
    for model, kw in ((other_tiny_target, {}), (tiny_target, {"dtype": "bfloat16"})):
        with serve(model, store_root, tmp_path, **kw) as client:
            assert client.get("/model").json()["fingerprint"] != fp_a
            assert client.get(f"/prompts/{pid}").status_code == 404
            [same] = register_ready(client, [{"token_ids": TOKENS}])
            assert same == pid and metric(client, COMPUTED) == 1
            hidden = get_hidden(client, pid, "3")[0]["hidden"]
        expected = direct_layer_outputs(model, TOKENS, dtype=hidden.dtype)[3]
        assert torch.equal(hidden, expected)


def test_prompt_interrupted_before_publish_is_recomputed(tiny_target: Path, store_root: str, tmp_path: Path) -> None:
    with serve(tiny_target, store_root, tmp_path) as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}])
    [group] = published(store_root)
    open_blobs(store_root).delete(group)  # as if the process died after writing the layers but before publishing them
    with serve(tiny_target, store_root, tmp_path) as client:  # computed again when asked for
        hidden = get_hidden(client, pid, "0,5")[0]["hidden"]
        assert metric(client, COMPUTED) == 1
        assert client.get(f"/prompts/{pid}").json()["layers_stored"] == list(range(6))
    ref = direct_layer_outputs(tiny_target, TOKENS)
    assert torch.equal(hidden, torch.cat([ref[0], ref[5]], dim=1))


def test_shutdown_with_a_queue_loses_nothing_and_computes_nothing_twice(
    tiny_target: Path, store_root: str, tmp_path: Path
) -> None:
    body = {"prompts": [{"token_ids": [5, 6, n]} for n in range(12)], "generate": {"max_new_tokens": 40}}
    with serve(tiny_target, store_root, tmp_path, batch_tokens=64) as client:  # small batches: the queue is long
        ids = [p["prompt_id"] for p in client.post("/prompts", json=body).json()["prompts"]]
    done = len(published(store_root))  # the batch in hand finished; the rest waits
    with serve(tiny_target, store_root, tmp_path) as client:
        for pid in ids:
            assert len(get_hidden(client, pid, "3")[0]["token_ids"]) == 43
        assert metric(client, COMPUTED) == len(ids) - done
