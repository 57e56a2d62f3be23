"""The docs' tutorials run as written (`testing/tutorials.py`): every shell block of each page, in
order, for real, on the tiny target against a real server on loopback; then what the page says came of
them is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing.tutorials import ROOT, run_tutorial, shell_blocks

pytestmark = pytest.mark.slow

TUTORIALS = ROOT / "docs" / "tutorials"


def _tau(report: Path) -> float:
    return float(json.loads(report.read_text())["summary"]["chain"]["mean_tau"])


def test_evaluate_your_first_checkpoint_runs_as_written(tmp_path: Path) -> None:
    page = TUTORIALS / "first-checkpoint.md"
    outputs = run_tutorial(page, tmp_path)
    assert len(outputs) == sum(b.how == "run" for b in shell_blocks(page)) >= 5
    reports = tmp_path / "tutorial" / "reports"
    # "the step-40 drafter's tau is above the step-10 one's"
    assert _tau(reports / "dflash_step_40.json") > _tau(reports / "dflash_step_10.json") >= 1.0
    rows = [line.split() for line in outputs[-1].splitlines() if " dflash: " in line]  # compare's: step, run
    assert {row[0] for row in rows} >= {"10", "40"}
    assert (tmp_path / "tutorial" / "tau.png").read_bytes()[:4] == b"\x89PNG"


def test_train_from_the_cache_runs_as_written(tmp_path: Path) -> None:
    outputs = run_tutorial(TUTORIALS / "train-from-the-cache.md", tmp_path)
    assert "epoch 9: mean loss" in outputs[2]  # the loop ran its ten epochs (it asserts the loss fell)
    files = sorted((tmp_path / "tutorial" / "sf-dflash").glob("*.ckpt"))
    assert len(files) == 4 and "'hidden_states': (1, " in outputs[3]
