"""The target runs once per prompt, however many requests and layer sets ask."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from tests.cache_server.helpers import app_client, get_hidden, metric, register_ready
from tests.cache_server.reference import direct_layer_outputs

TOKENS = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11, 64, 65]
COMPUTED = "cache_server_prompts_computed_total"


def test_concurrent_requests_for_many_layer_sets_compute_once(tiny_target: Path, tmp_path: Path) -> None:
    layer_sets = ["0", "1,2", "5,4,3", "0,1,2,3,4,5", "2"] * 4
    with app_client(tiny_target, tmp_path / "store") as client:
        pid = client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}]}).json()["prompts"][0]["prompt_id"]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda ls: get_hidden(client, pid, ls)[0]["hidden"], layer_sets))
        assert metric(client, COMPUTED) == 1
        assert client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}]}).json()["prompts"][0] == {
            "prompt_id": pid,
            "status": "ready",
        }
        assert metric(client, COMPUTED) == 1
    ref = direct_layer_outputs(tiny_target, TOKENS)
    for layers, hidden in zip(layer_sets, results, strict=True):
        assert torch.equal(hidden, torch.cat([ref[int(k)] for k in layers.split(",")], dim=1))


def test_layers_outside_capture_set_recompute_once_and_extend(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store", capture_layers="1,3") as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}], layer=1)
        assert client.get("/model").json()["capture_layers"] == [1, 3]
        assert client.get(f"/prompts/{pid}").json()["layers_stored"] == [1, 3]
        assert metric(client, COMPUTED) == 1
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: get_hidden(client, pid, "0,3,5")[0]["hidden"], range(6)))
        assert metric(client, COMPUTED) == 2  # one recompute for the missing layers, shared by all six
        assert client.get(f"/prompts/{pid}").json()["layers_stored"] == [0, 1, 3, 5]
        get_hidden(client, pid, "5,1")
        assert metric(client, COMPUTED) == 2
    ref = direct_layer_outputs(tiny_target, TOKENS)
    for hidden in results:
        assert torch.equal(hidden, torch.cat([ref[0], ref[3], ref[5]], dim=1))


def test_the_same_tokens_are_the_same_prompt(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        text_id = client.post("/prompts", json={"prompts": [{"text": "def fib(n):"}]}).json()["prompts"][0]
        tokens = client.get(f"/prompts/{text_id['prompt_id']}").json()["token_ids"] or None
        if tokens is None:  # still pending: the prompt tokens are the registered ones
            register_ready(client, [{"text": "def fib(n):"}])
            tokens = client.get(f"/prompts/{text_id['prompt_id']}").json()["token_ids"]
        same = client.post("/prompts", json={"prompts": [{"token_ids": tokens}]}).json()["prompts"][0]
        assert same["prompt_id"] == text_id["prompt_id"]
        assert metric(client, COMPUTED) == 1


def test_prompts_are_listed_in_pages(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        ids = register_ready(client, [{"token_ids": TOKENS[:n], "name": f"p{n}"} for n in (3, 4, 5)])
        first = client.get("/prompts", params={"limit": 2}).json()
        rest = client.get("/prompts", params={"offset": 2, "limit": 2}).json()
        assert (first["total"], len(first["prompts"]), len(rest["prompts"])) == (3, 2, 1)
        listed = first["prompts"] + rest["prompts"]
        assert sorted(p["prompt_id"] for p in listed) == sorted(ids)
        assert all(p["status"] == "ready" and p["token_ids"] is None for p in listed)
        assert sorted(p["num_tokens"] for p in listed) == [3, 4, 5]
        assert client.get("/prompts", params={"status": "failed"}).json()["total"] == 0
        assert client.get("/prompts", params={"limit": 0}).status_code == 422
