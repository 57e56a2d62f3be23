"""`GET /hidden?encoding=pieces`: the client decodes the stored pieces into exactly the array the
safetensors body carries, over real HTTP, for whole prompts, ranges across chunks and RAM-cache hits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cache_server.api.app import create_app
from cache_server.client import CacheClient, OutMismatch
from cache_server.store import chunks
from schemas.pieces import read_pieces_header
from testing.servers import serving_app
from tests.cache_server.helpers import register_ready, serve_settings

TOKENS = list(range(5, 45))  # 40 tokens: three 16-row chunks below
RANGES = [(None, None), (3, 37), (16, 32), (31, 33), (39, 40)]


@pytest.mark.parametrize(("dtype", "ram_cache_gb"), [("float32", 0.0), ("bfloat16", 0.0), ("float32", 0.01)])
def test_pieces_decode_to_the_safetensors_array(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, ram_cache_gb: float
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)
    settings = serve_settings(tiny_target, tmp_path / "store", dtype=dtype, ram_cache_gb=ram_cache_gb)
    app = create_app(settings)
    with TestClient(app) as local:  # registers and computes the prompt in this process
        [pid] = register_ready(local, [{"token_ids": TOKENS}], layer=3)
    with serving_app(create_app(settings)) as url, CacheClient(url) as client:
        for start, stop in RANGES:
            pieces = client.hidden(pid, [4, 0, 2], start=start, stop=stop)  # the default
            plain = client.hidden(pid, [4, 0, 2], start=start, stop=stop, encoding="safetensors")
            assert pieces.hidden.dtype == plain.hidden.dtype and pieces.hidden.shape == plain.hidden.shape
            assert pieces.hidden.tobytes() == plain.hidden.tobytes(), (start, stop)
            assert np.array_equal(pieces.token_ids, plain.token_ids)
            assert pieces.metadata == plain.metadata


def test_pieces_are_the_stored_blosc_blocks_unless_ram_cached(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)
    kinds = {}
    for ram in (0.0, 0.01):
        with TestClient(create_app(serve_settings(tiny_target, tmp_path / f"s{ram}", ram_cache_gb=ram))) as c:
            [pid] = register_ready(c, [{"token_ids": TOKENS}], layer=1)
            body = c.get("/hidden", params={"prompt_id": pid, "layers": "1", "encoding": "pieces"})
            assert body.headers["content-type"].startswith("application/x-hidden-state-pieces")
            header, _ = read_pieces_header(memoryview(body.content))
            kinds[ram] = sorted({p[3] for p in header["pieces"]})
            plain = c.get("/hidden", params={"prompt_id": pid, "layers": "1"})
            if not ram:
                assert len(body.content) < len(plain.content)  # compressed on the wire
    assert kinds == {0.0: ["blosc"], 0.01: ["raw"]}


@pytest.mark.parametrize("encoding", ["pieces", "safetensors"])
def test_results_own_their_memory_and_out_receives_the_same_bytes(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: Any
) -> None:
    """Bodies land in a reused receive buffer: no result may alias it, and `out` gets the same bytes."""
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)
    settings = serve_settings(tiny_target, tmp_path / "store", dtype="bfloat16")
    with TestClient(create_app(settings)) as local:
        [pid] = register_ready(local, [{"token_ids": TOKENS}], layer=3)
    with serving_app(create_app(settings)) as url, CacheClient(url) as client:
        first = client.hidden(pid, [4, 0, 2], encoding=encoding)
        kept = first.hidden.tobytes(), first.token_ids.tobytes()
        client.hidden(pid, [1, 3], start=5, stop=30, encoding=encoding)  # reuses the receive buffer
        assert (first.hidden.tobytes(), first.token_ids.tobytes()) == kept
        out = np.zeros_like(first.hidden)
        into = client.hidden(pid, [4, 0, 2], encoding=encoding, out=out)
        assert into.hidden is out and out.tobytes() == kept[0]
        with pytest.raises(OutMismatch, match=r"shape \[40, 192\]"):
            client.hidden(pid, [4, 0, 2], encoding=encoding, out=out[:, :128])
        with pytest.raises(OutMismatch, match="bfloat16"):
            client.hidden(pid, [4, 0, 2], encoding=encoding, out=np.zeros(out.shape, np.float32))


def _flipping_once(app: Any, at: int) -> Any:
    """`app`, but the first pieces body it sends has byte `at` flipped (damage after the server read it)."""
    flipped = False

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        sent = 0

        async def damaging(message: dict[str, Any]) -> None:
            nonlocal sent, flipped
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and not flipped and sent <= at < sent + len(body):
                damaged = bytearray(body)
                damaged[at - sent] ^= 0x20
                message, flipped = {**message, "body": bytes(damaged)}, True
            sent += len(body)
            await send(message)

        pieces = scope["type"] == "http" and b"encoding=pieces" in scope["query_string"]
        await app(scope, receive, damaging if pieces else send)

    return wrapped


def test_a_piece_damaged_on_the_way_is_asked_for_again_never_decoded(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(chunks, "CHUNK_TOKENS", 16)
    settings = serve_settings(tiny_target, tmp_path / "store")
    with TestClient(create_app(settings)) as local:
        [pid] = register_ready(local, [{"token_ids": TOKENS}], layer=3)
        body = local.get("/hidden", params={"prompt_id": pid, "layers": "3", "encoding": "pieces"}).content
    header, data = read_pieces_header(memoryview(body))
    first = header["pieces"][0]
    assert first[3] == "blosc" and first[7]  # a Blosc piece with its blocks' digests
    at = data + first[4] + first[5] - 3  # inside its last block
    with serving_app(_flipping_once(create_app(settings), at)) as url, CacheClient(url) as client:
        with caplog.at_level("WARNING", logger="cache_server.client"):
            got = client.hidden(pid, [3])
        plain = client.hidden(pid, [3], encoding="safetensors")
    assert got.hidden.tobytes() == plain.hidden.tobytes()
    assert any("does not match its checksum; asking again" in r.getMessage() for r in caplog.records)
