"""`prompts add`: a bad row stops it with a message that names the row and how to go on without it; `--wait`'s
bar, over a server's `GET /sets` answers (httpx.MockTransport), shows where the pending prompts are (queued,
generating, capturing) while none is ready, rather than a frozen 0/N."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cache_server.client import CacheClient
from eval_worker.prompt_files.records import BadRow
from eval_worker.prompt_files.register import DEFAULT_MAX_NEW_TOKENS, AddOptions, collect_rows, wait_with_progress
from schemas.prompts import GenerateSpec

CHAT = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}


@pytest.mark.parametrize(("whole_chats", "bad"), [(True, {"question": "no chat"}), (False, {"question": ""})])
def test_a_bad_row_names_skip_bad(tmp_path: Path, whole_chats: bool, bad: dict[str, str]) -> None:
    rows = tmp_path / "chats.jsonl"
    rows.write_text(json.dumps(CHAT) + "\n" + json.dumps(bad) + "\n")
    opts = AddOptions(
        set_name="chats", generate=GenerateSpec(max_new_tokens=DEFAULT_MAX_NEW_TOKENS), whole_chats=whole_chats
    )
    with pytest.raises(BadRow, match=r"^.*chats.jsonl row 1: .* \(--skip-bad skips such rows, listing them\)$"):
        collect_rows([rows], opts)
    kept, skipped = collect_rows([rows], dataclasses.replace(opts, skip_bad=True))
    assert len(kept) == 1 and len(skipped) == 1 and "--skip-bad" not in skipped[0]


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
