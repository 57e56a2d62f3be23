"""A real `cache-server serve` process on loopback, driven through the Python client."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.client import CacheClient, InvalidRequestError, NotFoundError, ServerUnreachable
from schemas.prompts import PromptStatus
from testing.servers import free_port, running_server
from tests.cache_server.reference import direct_layer_outputs

pytestmark = pytest.mark.slow


def test_client_against_a_real_server(tiny_target: Path, tmp_path: Path) -> None:
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url) as client:
        info = client.model()
        assert (info.num_layers, info.hidden_size, info.layer_convention) == (6, 64, "decoder_output_0based")
        registered = client.register(
            [{"text": "def fib(n):", "name": "fib"}, {"token_ids": [5, 6, 7]}], max_new_tokens=16
        )
        ids = [p.prompt_id for p in registered]
        client.wait_ready(ids, timeout_s=60)
        states = [client.prompt(pid) for pid in ids]
        assert [s.name for s in states] == ["fib", None]

        def fetch(layers: tuple[int, ...]) -> torch.Tensor:
            return client.hidden(ids[0], layers).to_torch()[0]

        layer_sets = [(1, 4), (5,), (0, 2, 3), (4, 1)] * 3
        with ThreadPoolExecutor(6) as pool:
            served = list(pool.map(fetch, layer_sets))
        metrics = httpx.get(f"{url}/metrics").text
        assert re.search(r"^cache_server_prompts_computed_total 2\.0$", metrics, re.MULTILINE)

        result = client.hidden(ids[0], [3, 1], start=2, stop=7)
        assert result.metadata.layers == [3, 1] and result.metadata.model_fingerprint == info.fingerprint
        tokens = states[0].token_ids
        assert tokens is not None and result.token_ids.tolist() == tokens[2:7]

        heads = client.heads()
        assert heads.fingerprint == info.fingerprint

        with pytest.raises(InvalidRequestError, match=r"0\.\.5"):
            client.hidden(ids[0], [6])
        with pytest.raises(NotFoundError):
            client.hidden("missing", [1])

    ref = direct_layer_outputs(tiny_target, tokens)
    for layers, hidden in zip(layer_sets, served, strict=True):
        assert torch.equal(hidden, torch.cat([ref[k] for k in layers], dim=1))
    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    embed, lm_head = heads.to_torch()
    assert torch.equal(embed, model.get_input_embeddings().weight)
    assert torch.equal(lm_head, model.get_output_embeddings().weight)


def test_options_come_from_the_environment(tiny_target: Path, tmp_path: Path) -> None:
    env = {"CACHE_SERVER_CAPTURE_LAYERS": "2,4", "CACHE_SERVER_DTYPE": "bfloat16"}
    with running_server(tiny_target, tmp_path / "store", env=env) as url, CacheClient(url) as client:
        info = client.model()
        assert info.capture_layers == [2, 4] and info.dtype == "bfloat16"


def test_unreachable_server_is_a_typed_error() -> None:
    with (
        CacheClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client,
        pytest.raises(ServerUnreachable),
    ):
        client.model()


def test_a_feature_server_that_is_down_is_unreachable_not_a_crash(tiny_target: Path, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url, feature_servers=[down]) as client:
        [p] = client.register([{"token_ids": [5, 6, 7, 8]}])
        client.wait_ready([p.prompt_id])
        with pytest.raises(ServerUnreachable, match=down):  # the job worker waits and retries on this
            client.hidden(p.prompt_id, [2])


def test_client_survives_a_server_restart(tiny_target: Path, tmp_path: Path) -> None:
    store, port = tmp_path / "store", free_port()
    with CacheClient(f"http://127.0.0.1:{port}", timeout=10) as client:
        with running_server(tiny_target, store, port=port):
            [p] = client.register([{"token_ids": [5, 6, 7, 8]}])
            client.wait_ready([p.prompt_id])
            before = client.hidden(p.prompt_id, [2]).to_torch()[0].clone()  # leaves a kept-alive connection
        with pytest.raises(ServerUnreachable):
            client.hidden(p.prompt_id, [2])
        with running_server(tiny_target, store, port=port):
            assert torch.equal(client.hidden(p.prompt_id, [2]).to_torch()[0], before)
        with running_server(tiny_target, store, port=port):  # the kept-alive connection is stale now
            assert torch.equal(client.hidden(p.prompt_id, [2]).to_torch()[0], before)


def test_wait_ready_on_many_prompts_reads_the_listing(tiny_target: Path, tmp_path: Path) -> None:
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url) as client:
        ids = [p.prompt_id for p in client.register([{"token_ids": [5, 6, n]} for n in range(40)])]
        seen: list[tuple[int, int]] = []
        client.wait_ready(ids, timeout_s=60, progress=lambda ready, total: seen.append((ready, total)))
        assert seen[-1] == (40, 40) and all(total == 40 for _, total in seen)
        assert [r for r, _ in seen] == sorted(r for r, _ in seen)  # ready only grows
        states = client.prompts()
        assert len(states) == 40 and {s.status for s in states} == {PromptStatus.ready}
        with pytest.raises(NotFoundError, match="not registered"):
            client.wait_ready([*ids, "nope"], timeout_s=5)
