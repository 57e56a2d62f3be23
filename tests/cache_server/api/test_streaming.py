"""Streamed `/hidden` bodies: the same bytes as the one-buffer body, block by block; a block buffer a
transport still holds is never reused; and slow clients of a real server get every byte."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from cache_server.api.bodies import hidden_body
from cache_server.api.streaming import BlockBuffers, hidden_stream, row_blocks
from cache_server.store import chunks
from cache_server.store.hidden_store import HiddenStore
from testing.servers import running_server
from tests.cache_server.helpers import app_client, register_ready

TOKENS = list(range(5, 45))  # 40 tokens


def test_row_blocks_follow_chunk_boundaries() -> None:
    assert row_blocks(0, 40, 16) == [(0, 16), (16, 32), (32, 40)]
    assert row_blocks(5, 17, 16) == [(5, 16), (16, 17)]
    assert row_blocks(3, 9, 16) == [(3, 9)]


@pytest.mark.parametrize(("start", "stop"), [(None, None), (3, 37), (16, 32), (31, 33)])
def test_a_streamed_body_is_the_one_buffer_body(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: int | None, stop: int | None
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)  # 40 tokens: three chunks, so several blocks
    with app_client(tiny_target, tmp_path / "store") as client:  # streaming is the default
        [pid] = register_ready(client, [{"token_ids": TOKENS}])
        params = {"prompt_id": pid, "layers": "4,0,2", **({"start": start, "stop": stop} if start else {})}
        streamed = client.get("/hidden", params=params)
        service = client.app.state.service  # type: ignore[attr-defined]
        manifest = service.store.manifest(pid)
        lo, hi = (start or 0), (stop or len(TOKENS))
        assert streamed.status_code == 200
        assert int(streamed.headers["content-length"]) == len(streamed.content)
        assert streamed.content == hidden_body(service.store, manifest, [4, 0, 2], lo, hi).buffer.tobytes()


def test_a_buffer_a_transport_still_holds_is_never_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop keeps the memoryviews it has not finished writing: hold on to every piece of one stream,
    run more streams over the same buffers, and the held bytes must not change."""
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)
    rng = np.random.default_rng(0)
    layers = {k: torch.from_numpy(rng.standard_normal((40, 64), np.float32)) for k in range(3)}
    buffers, pool = BlockBuffers(), ThreadPoolExecutor(2)

    async def run(store: HiddenStore, hold: list[memoryview], order: list[int]) -> bytes:
        stream = await hidden_stream(store, store.manifest("p"), order, 0, 40, pool, buffers)  # type: ignore[arg-type]
        pieces = [piece async for piece in stream.pieces]
        hold.extend(p for p in pieces if isinstance(p, memoryview))
        return b"".join(bytes(p) for p in pieces)

    with HiddenStore(tmp_path, fingerprint="fp", model_name="m", hidden_size=64, dtype=torch.float32) as store:
        store.write("p", np.arange(40), 8, layers)
        held: list[memoryview] = []
        first = asyncio.run(run(store, held, [2, 0, 1]))
        snapshot = [bytes(v) for v in held]
        other = asyncio.run(run(store, [], [1, 2, 0]))  # other bytes: may only use buffers nobody holds
        assert [bytes(v) for v in held] == snapshot
        assert asyncio.run(run(store, [], [1, 2, 0])) == other  # ... and it reuses its own freed ones
        del held
        assert asyncio.run(run(store, [], [2, 0, 1])) == first
    pool.shutdown()


@pytest.mark.slow
def test_slow_concurrent_clients_of_a_real_server_get_exact_bytes(tiny_target: Path, tmp_path: Path) -> None:
    tokens = [int(t) for t in np.random.default_rng(0).integers(3, 500, 3000)]  # 3 blocks of 1024 rows
    with running_server(tiny_target, tmp_path / "store") as url:
        pid = httpx.post(f"{url}/prompts", json={"prompts": [{"token_ids": tokens}]}).json()["prompts"][0]["prompt_id"]
        path = f"/hidden?prompt_id={pid}&layers=0,1,2,3,4,5"
        expected = httpx.get(f"{url}{path}", timeout=60).content  # 4.6 MB, computed and stored
        port = int(url.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        for s in slow:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(1.0)  # the server has sent what fits and holds the rest in its transport buffers
        for s in slow:
            data = b""
            while len(data) < len(expected) or b"\r\n\r\n" not in data:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data and len(data) - data.index(b"\r\n\r\n") - 4 >= len(expected):
                    break
            s.close()
            assert data[data.index(b"\r\n\r\n") + 4 :] == expected
