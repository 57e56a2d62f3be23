"""`prompts add --wait`'s bar, over a server's `GET /sets` answers (httpx.MockTransport): while no prompt
is ready it shows where the pending ones are (queued, generating, capturing) rather than a frozen 0/N."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cache_server.client import CacheClient
from eval_worker.prompt_files.register import wait_with_progress


def _sets(answers: Iterator[dict[str, int]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/sets"
        counts = next(answers)
        return httpx.Response(200, json={"sets": [{"name": "gsm8k", "total": 6, "failed": 0, **counts}]})

    return httpx.MockTransport(handler)


def test_the_bar_shows_prompts_being_generated_before_any_is_ready(capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([
        {"pending": 6, "ready": 0, "queued": 2, "generating": 4, "capturing": 0},
        {"pending": 1, "ready": 5, "queued": 0, "generating": 0, "capturing": 1},
        {"pending": 0, "ready": 6},
    ])  # fmt: skip
    with CacheClient("http://cache", transport=_sets(answers)) as client:
        wait_with_progress(client, "gsm8k", timeout_s=60, poll_s=0)
    bar = capsys.readouterr().err
    assert "0/6" in bar and "4 generating, 2 queued]" in bar
    assert "5/6" in bar and "1 capturing]" in bar
    assert "6/6" in bar
