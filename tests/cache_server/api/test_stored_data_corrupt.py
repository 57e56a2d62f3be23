"""A stored chunk that does not decode is answered as a typed store error (503 `stored_data_corrupt`
with Retry-After), never served, logged once, and its layer captured again: the next request gets
the exact bytes the prompt had before, whichever way the body is sent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import pytest

from cache_server.api.app import create_app
from cache_server.client import CacheClient, NotReadyError
from cache_server.store import chunks as arrays
from schemas.block_digests import block_spans
from testing.servers import server_metric, serving_app
from tests.cache_server.helpers import app_client, error_message, metric, register_ready, serve_settings

BODIES = {  # name -> (server settings, request params)
    "streamed": ({"stream_hidden": True}, {}),
    "one buffer": ({"stream_hidden": False}, {}),
    "pieces": ({}, {"encoding": "pieces"}),
}


def _corrupt_chunks(store: Path, prompt_id: str, layer: int) -> int:
    """Flip bytes in the middle of every stored chunk of one layer; how many chunks."""
    found = [p for p in store.rglob(f"prompts/{prompt_id}/layers/{layer}/c/**/*") if p.is_file()]
    for chunk in found:
        data = bytearray(chunk.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 16] = bytes(b ^ 0x5A for b in data[middle : middle + 16])
        chunk.write_bytes(bytes(data))
    return len(found)


@pytest.mark.parametrize("body", list(BODIES))
def test_a_corrupt_layer_is_refused_then_captured_again(
    tiny_target: Path, tmp_path: Path, body: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings, params = BODIES[body]
    store = tmp_path / "store"
    with app_client(tiny_target, store, **settings) as client:
        (pid,) = register_ready(client, [{"token_ids": [5, 6, 7, 8, 9, 10]}])
        query = {"prompt_id": pid, "layers": "2,4", **params}
        before = client.get("/hidden", params=query).content
        computed = metric(client, "cache_server_prompts_computed_total")
        assert _corrupt_chunks(store, pid, 4) == 1

        with caplog.at_level(logging.ERROR, logger="cache_server"):
            refused = client.get("/hidden", params=query)
            message = error_message(refused, 503, "stored_data_corrupt")
            assert f"prompt {pid!r} layer 4" in message and "being captured again" in message
            assert refused.headers["Retry-After"] == "1"
            again = client.get("/hidden", params=query)  # waits for the capture of layer 4
            assert again.status_code == 200 and again.content == before
            assert client.get("/hidden", params=query).content == before
        assert metric(client, "cache_server_prompts_computed_total") == computed + 1
        assert metric(client, "cache_server_stored_data_corrupt_total") == 1
        assert sum("capturing layers [4] again" in r.getMessage() for r in caplog.records) == 1
        assert client.get(f"/prompts/{pid}").json()["layers_stored"] == [0, 1, 2, 3, 4, 5]  # all captured, 4 again


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """64-row chunks of 4 KiB Blosc blocks: a 64-wide fp32 chunk is 4 blocks of 16 rows."""
    monkeypatch.setattr(arrays, "CHUNK_TOKENS", 64)
    monkeypatch.setattr(arrays, "BLOSC_BLOCKSIZE", 4096)


@pytest.mark.parametrize("encoding", ["pieces", "safetensors"])
def test_a_row_range_over_a_rotten_block_is_refused_through_the_light_client_then_served_exact(
    tiny_target: Path, tmp_path: Path, small_blocks: None, encoding: Literal["pieces", "safetensors"]
) -> None:
    """Rows 20-60 need blocks 1-3 of chunk 0, not the whole chunk: a byte flipped in block 2 is still
    caught (by the server before it decodes or sends the block), and the layer comes back bit-identical."""
    store = tmp_path / "store"
    with serving_app(create_app(serve_settings(tiny_target, store))) as url, CacheClient(url) as client:
        (registered,) = client.register([{"token_ids": list(range(5, 105))}])
        pid = registered.prompt_id
        client.wait_ready([pid])
        before = client.hidden(pid, [2, 4], start=20, stop=60, encoding=encoding)
        computed = server_metric(url, "cache_server_prompts_computed_total")
        chunk = store / client.model().fingerprint / "prompts" / pid / "layers" / "4" / "c" / "0" / "0"
        data = bytearray(chunk.read_bytes())
        a, b = block_spans(bytes(data))[2]
        data[(a + b) // 2] ^= 0x04
        chunk.write_bytes(bytes(data))
        with pytest.raises(NotReadyError, match="layer 4: chunk 0 block 2 does not match its checksum"):
            client.hidden(pid, [2, 4], start=20, stop=60, encoding=encoding)
        again = client.hidden(pid, [2, 4], start=20, stop=60, encoding=encoding)  # waits for the capture
        assert again.hidden.tobytes() == before.hidden.tobytes()
        assert server_metric(url, "cache_server_prompts_computed_total") == computed + 1
        assert server_metric(url, "cache_server_stored_data_corrupt_total") == 1
