"""The server's progress lines, on an injected clock: the rate counts the time spent on the prompts since
the last line (never an idle spell, never ~0 s), and a server generating responses says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cache_server.compute.progress import Progress
from tests.cache_server.helpers import app_client, register_ready


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "cache_server.compute.scheduler"]
    caplog.clear()
    return lines


def test_the_rate_counts_the_batches_not_the_idle_spells(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cache_server.compute.scheduler")
    clock = Clock()
    progress = Progress("computed", "prompts", every_s=5.0, clock=clock)
    clock.t = 89.0  # a server idle since it started, then one batch of 5 prompts that took 0.5 s
    progress.done(5, 5000, began=88.5)
    assert _lines(caplog) == ["computed 5 prompts (5000 tokens) in 0.5 s, 10.0 prompts/s, 10000 tokens/s; 5 in all"]
    clock.t = 90.0  # within 5 s of the last line: counted, not logged
    progress.done(1, 100, began=89.5)
    assert _lines(caplog) == []
    clock.t = 400.0  # idle again, then a batch of 0.5 s: the rate is over the two batches' second
    progress.done(3, 300, began=399.5)
    assert _lines(caplog) == ["computed 4 prompts (400 tokens) in 1.0 s, 4.0 prompts/s, 400 tokens/s; 9 in all"]


def test_overlapping_requests_count_their_time_once_and_a_still_clock_gives_no_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cache_server.compute.scheduler")
    clock = Clock()
    progress = Progress("generated", "responses", every_s=5.0, clock=clock)
    clock.t = 20.0  # three requests sent to an engine at once, at 0, answered at 20, 21 and 26
    progress.done(1, 200, began=0.0)
    clock.t = 21.0
    progress.done(1, 100, began=0.0)
    clock.t = 26.0
    progress.done(1, 500, began=0.0)
    assert _lines(caplog) == [
        "generated 1 responses (200 tokens) in 20.0 s, 0.1 responses/s, 10 tokens/s; 1 in all",
        "generated 2 responses (600 tokens) in 6.0 s, 0.3 responses/s, 100 tokens/s; 3 in all",
    ]
    still = Progress("computed", "prompts", clock=lambda: 5.0)
    still.done(2, 10, began=5.0)
    assert _lines(caplog) == ["computed 2 prompts (10 tokens); 2 in all"]


def test_a_server_generating_responses_logs_it(
    tiny_target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cache_server.compute")
    with app_client(tiny_target, tmp_path / "store") as client:
        register_ready(client, [{"token_ids": [5, 6, 7]}, {"token_ids": [9, 10, 11, 12]}], generate=4)
    lines = [r.getMessage() for r in caplog.records]
    assert "generating 2 responses (up to 4 new tokens each) on the target" in lines
    assert any(line.startswith("generated 2 responses (") and " tokens/s; 2 in all" in line for line in lines), lines
    assert any(line.startswith("computed ") and " prompts/s, " in line for line in lines), lines
