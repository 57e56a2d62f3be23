"""The OpenAPI document says what the server does: every error status a route can send, the binary
bodies, and a description for every route (what `/docs` shows)."""

from __future__ import annotations

from typing import Any

import pytest

from cache_server.api.app import create_app
from tests.cache_server.helpers import serve_settings


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("openapi")
    return create_app(serve_settings(tmp, tmp / "store")).openapi()  # no lifespan: nothing is loaded


def _op(spec: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return spec["paths"][path][method]


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("get", "/hidden", {"404", "409", "422", "503"}),
        ("post", "/prompts", {"401", "422"}),
        ("get", "/prompts/{prompt_id}", {"404"}),
        ("post", "/jobs", {"401", "403", "422"}),
        ("delete", "/jobs/{job_id}", {"204", "401", "404"}),
        ("get", "/jobs/{job_id}/report", {"404", "409"}),
        ("post", "/jobs/{job_id}/complete", {"401", "404", "409"}),
        ("post", "/jobs/claim", {"204", "401"}),
    ],
)
def test_error_statuses_are_declared(spec: dict[str, Any], method: str, path: str, statuses: set[str]) -> None:
    responses = _op(spec, method, path)["responses"]
    assert statuses <= set(responses)
    for status in statuses - {"204"}:
        assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


def test_deleting_a_running_job_is_declared_to_answer_its_cancelling_state(spec: dict[str, Any]) -> None:
    cancelled = _op(spec, "delete", "/jobs/{job_id}")["responses"]["202"]
    assert cancelled["content"]["application/json"]["schema"]["$ref"].endswith("/JobState")


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/hidden", "application/octet-stream"),
        ("/target/heads", "application/octet-stream"),
        ("/metrics", "text/plain"),
    ],
)
def test_binary_bodies_are_declared(spec: dict[str, Any], path: str, media_type: str) -> None:
    content = _op(spec, "get", path)["responses"]["200"]["content"]
    [declared] = [c for c in content if c.startswith(media_type)]
    assert content[declared]["schema"] == {"type": "string", "format": "binary"}


def test_every_route_explains_itself(spec: dict[str, Any]) -> None:
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert op.get("description"), f"{method.upper()} {path} has no description"
