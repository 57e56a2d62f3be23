"""Bad input gets a clear 4xx as `{"error": {...}}`; the server keeps serving, stored data intact."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from cache_server.api.app import build_service, create_app
from cache_server.compute.service import HiddenStateService
from cache_server.settings import ServeSettings
from tests.cache_server.helpers import app_client, error_message, get_hidden, register_ready, serve_settings

TOKENS = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11, 64, 65]


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with app_client(tiny_target, tmp_path_factory.mktemp("store")) as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}])
        yield client, pid, get_hidden(client, pid, "0,1,2,3,4,5")[0]["hidden"].clone()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompts": []}, "at least 1"),
        ({"prompts": [{"text": "x", "colour": "red"}]}, "colour"),
        ({"prompts": [{}]}, "exactly one of"),
        ({"prompts": [{"text": "a", "token_ids": [1]}]}, "exactly one of"),
        ({"prompts": [{"token_ids": [1, 2, 100000]}]}, "outside the vocabulary"),
        ({"prompts": [{"token_ids": [-1]}]}, "outside the vocabulary"),
        ({"prompts": [{"token_ids": [1], "response_token_ids": [512]}]}, "response_token_ids"),
        ({"prompts": [{"token_ids": [1] * 5000}]}, "beyond the model's context"),
        ({"prompts": [{"token_ids": [1]}], "generate": {"max_new_tokens": 10**9}}, "max_new_tokens"),
        (
            {"prompts": [{"token_ids": [1]}], "generate": {"max_new_tokens": 4096}},
            "beyond the model's context",
        ),
        ({"prompts": [{"token_ids": [1]}], "generate": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"prompts": [{"text": "abc\ud800"}]}, "not valid Unicode"),  # a lone surrogate
        ({"prompts": [{"messages": [{"role": "user", "content": "\udfff"}]}]}, "not valid Unicode"),
        ({"prompts": [{"token_ids": [True, False]}]}, "token_ids"),  # ids are plain integers
        ({"prompts": [{"token_ids": ["5", "7"]}]}, "token_ids"),
        ({"prompts": [{"token_ids": [5.0]}]}, "token_ids"),
        ({"prompts": [{"token_ids": [5], "response_token_ids": [True]}]}, "response_token_ids"),
    ],
)
def test_bad_registrations(served, body: dict, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    # JSON as a client writes it: ASCII with escapes, so that a lone surrogate arrives as "\ud800"
    sent = client.post("/prompts", content=json.dumps(body), headers={"content-type": "application/json"})
    assert needle in error_message(sent, 422)


def test_malformed_json(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    error_message(client.post("/prompts", content=b"{not json", headers={"content-type": "application/json"}), 422)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"layers": "6"}, "0..5"),
        ({"layers": "-1"}, "0..5"),
        ({"layers": "1,1"}, "duplicated"),
        ({"layers": ""}, "0..5"),
        ({"layers": "a,b"}, "0..5"),
        ({"layers": "1.5"}, "0..5"),
        ({"layers": "1", "start": 5, "stop": 3}, "start < stop"),
        ({"layers": "1", "stop": 999}, "stop <= 12"),
        ({"layers": "1", "start": -1}, "start < stop"),
        ({"layers": "1_0"}, "plain decimal integer"),  # Python's int() would read 10
        ({"layers": "\u0661"}, "plain decimal integer"),  # an Arabic-Indic one
        ({"layers": "1", "start": "1_0"}, "start"),
        ({"layers": "1", "stop": "\u0661"}, "stop"),
    ],
)
def test_bad_layer_requests(served, params: dict, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, pid, _ = served
    assert needle in error_message(client.get("/hidden", params={"prompt_id": pid, **params}), 422)


def test_messages_without_a_chat_template_are_refused(tiny_target: Path, tmp_path: Path) -> None:
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_target, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with app_client(plain, tmp_path / "store") as client:
        body = {"prompts": [{"messages": [{"role": "user", "content": "hi"}]}]}
        assert "no chat template" in error_message(client.post("/prompts", json=body), 422, "invalid_prompt")
        assert client.post("/prompts", json={"prompts": [{"text": "hi"}]}).status_code == 202


def test_unknown_prompt_and_route(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    assert "no prompt" in error_message(client.get("/hidden", params={"prompt_id": "nope", "layers": "1"}), 404)
    error_message(client.get("/prompts/nope"), 404)
    error_message(client.get("/no-such-route"), 404)


def test_server_still_serves_the_same_bytes_afterwards(served) -> None:  # type: ignore[no-untyped-def]
    client, pid, before = served
    assert torch.equal(get_hidden(client, pid, "0,1,2,3,4,5")[0]["hidden"], before)


class _GatedService:
    """Builds the real service, but its target waits for a gate before each forward."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, settings: ServeSettings) -> HiddenStateService:
        service = build_service(settings)
        capture, gate = service.target.capturer.capture, self.gate

        def gated_capture(*args, **kwargs):  # type: ignore[no-untyped-def]
            gate.wait(timeout=30)
            return capture(*args, **kwargs)

        service.target.capturer.capture = gated_capture  # type: ignore[method-assign]
        return service


def test_pending_prompt_gets_503_with_retry_after_then_data(tiny_target: Path, tmp_path: Path) -> None:
    build = _GatedService()
    app = create_app(serve_settings(tiny_target, tmp_path / "store", wait_s=0.2), build=build)
    with TestClient(app) as client:
        pid = client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}]}).json()["prompts"][0]["prompt_id"]
        r = client.get("/hidden", params={"prompt_id": pid, "layers": "1"})
        assert "still being computed" in error_message(r, 503)
        assert int(r.headers["Retry-After"]) > 0
        assert client.get(f"/prompts/{pid}").json()["status"] == "pending"
        build.gate.set()
        assert get_hidden(client, pid, "1")[0]["hidden"].shape == (len(TOKENS), 64)
