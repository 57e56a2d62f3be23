"""The demo's main path (smaller): real server, trained checkpoints, jobs, worker, leaderboard, plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.__main__ import main

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workdir", str(tmp_path / "demo"), "--layers", "6", "--new-tokens", "16", "--steps", "5", "40"]) == 0
    out = capsys.readouterr().out
    board = out[out.index("leaderboard") :].splitlines()
    rows = [line.split() for line in board if line.strip().split(" ")[0] in {"5", "40"}]
    assert [r[0] for r in rows] == ["5", "40"]  # one row per checkpoint, by step
    assert all(r[2:5] == ["[1,", "2,", "3]"] for r in rows)  # DFlash formula, 3 taps of 6 layers
    assert all(float(r[-3]) >= 1.0 for r in rows)  # chain tau counts the bonus token
    assert (tmp_path / "demo" / "tau.png").read_bytes()[:4] == b"\x89PNG"
