"""Small helpers for the cache-server tests."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from cache_server.api.app import create_app
from cache_server.settings import ServeSettings
from testing.tensors import parse_torch as parse


def serve_settings(model: Path, store: Path, **kw: object) -> ServeSettings:
    return ServeSettings(model=model, store=store, device="cpu", **kw)  # type: ignore[arg-type]


def app_client(model: Path, store: Path, **kw: object) -> TestClient:
    return TestClient(create_app(serve_settings(model, store, **kw)))


def metric(client: TestClient, name: str) -> float:
    text = client.get("/metrics").text
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def get_hidden(client: TestClient, prompt_id: str, layers: str, **params: object) -> tuple[dict, dict]:
    r = client.get("/hidden", params={"prompt_id": prompt_id, "layers": layers, **params})
    assert r.status_code == 200, r.text
    return parse(bytearray(r.content))


def register_ready(client: TestClient, prompts: list[dict], generate: int | None = None, layer: int = 0) -> list[str]:
    body: dict = {"prompts": prompts}
    if generate:
        body["generate"] = {"max_new_tokens": generate}
    r = client.post("/prompts", json=body)
    assert r.status_code == 202, r.text
    ids = [p["prompt_id"] for p in r.json()["prompts"]]
    for pid in ids:  # /hidden waits for pending prompts, so one call per prompt makes it ready
        client.get("/hidden", params={"prompt_id": pid, "layers": str(layer)})
    return ids


def error_message(response, status: int, code: str | None = None) -> str:  # type: ignore[no-untyped-def]
    """The message of an `{"error": {"code", "message"}}` body, after checking status, shape and code."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    if code is not None:
        assert body["error"]["code"] == code
    return str(body["error"]["message"])


def error_response(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """What the server sends for an error, for clients tested over httpx.MockTransport."""
    return httpx.Response(status, json={"error": {"code": code, "message": f"{code} happened"}}, headers=headers)
