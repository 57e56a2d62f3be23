"""The startup checks against engines that are not fit to generate: a small OpenAI-style app on
loopback stands in for an engine too old to return token ids, or one that serves several models.
(A real vLLM is in `test_engine_generator.py`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from cache_server.capture.target import open_hf_target
from cache_server.generation.engine import EngineRefused, EngineUnavailable, EngineUnfit, engine_root, response_tokens
from cache_server.generation.startup import checked_engine
from testing.servers import serving_app


def _engine_app(models: list[str], *, token_ids: bool) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    def models_() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": "abc", "finish_reason": "length"}
        if token_ids:
            choice["token_ids"] = [7] * body["max_tokens"]
        return {"choices": [choice]}

    return app


def test_an_engine_without_token_ids_is_refused_saying_what_to_enable(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    with serving_app(_engine_app(["tiny"], token_ids=False)) as url, pytest.raises(EngineUnfit) as e:
        checked_engine(url, target, model=None, timeout_s=10, concurrency=4)
    assert "return_token_ids" in str(e.value) and url in str(e.value)


def test_an_engine_with_other_tokens_is_refused_naming_both(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    with serving_app(_engine_app(["tiny"], token_ids=True)) as url, pytest.raises(EngineUnfit) as e:
        checked_engine(url, target, model=None, timeout_s=10, concurrency=4)
    message = str(e.value)
    assert "'tiny'" in message and target.info.name in message and "engine [7, 7," in message


def test_an_engine_with_several_models_needs_one_named(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    with serving_app(_engine_app(["a", "b"], token_ids=True)) as url:
        with pytest.raises(EngineUnfit, match="name one with --generator-model"):
            checked_engine(url, target, model=None, timeout_s=10, concurrency=4)
        with pytest.raises(EngineUnfit, match="not --generator-model 'c'"):
            checked_engine(url, target, model="c", timeout_s=10, concurrency=4)


def test_an_engine_that_is_down_is_refused(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    with pytest.raises(EngineUnfit, match="GET /v1/models failed"):
        checked_engine("http://127.0.0.1:9", target, model=None, timeout_s=2, concurrency=4)


def test_answers_are_read_by_status() -> None:
    request = httpx.Request("POST", "http://engine/v1/completions")
    ok = httpx.Response(200, json={"choices": [{"token_ids": [1, 2]}]}, request=request)
    assert response_tokens(ok) == [1, 2]
    with pytest.raises(EngineUnavailable, match="HTTP 503: overloaded"):
        response_tokens(httpx.Response(503, json={"error": {"message": "overloaded"}}, request=request))
    with pytest.raises(EngineRefused, match=r"HTTP 400.*too long"):
        response_tokens(httpx.Response(400, json={"error": {"message": "too long"}}, request=request))
    with pytest.raises(EngineRefused, match="no choices"):
        response_tokens(httpx.Response(200, json={}, request=request))


def test_the_engine_url_is_taken_with_or_without_v1(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    with serving_app(_engine_app(["a", "b"], token_ids=True)) as url:
        for form in ("{}", "{}/", "{}/v1", "{}/v1/"):
            with pytest.raises(EngineUnfit, match="not --generator-model 'c'"):  # it reached /v1/models
                checked_engine(form.format(url), target, model="c", timeout_s=10, concurrency=4)
    assert engine_root("http://h:8000/v1/") == engine_root("http://h:8000") == "http://h:8000"
