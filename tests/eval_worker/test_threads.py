"""The commands that walk drafters set torch's CPU threads at startup: one by default (a drafter's
small matrix ops stall on several threads when other work shares the cores), `--threads N` when
given, torch's own under OMP_NUM_THREADS or `--threads 0`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from eval_worker.settings import EvaluateSettings
from eval_worker.threads import cpu_threads

_NOWHERE = "http://127.0.0.1:9"  # nothing listens: the command stops right after startup


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch at two threads, as its default is on a 2-core machine (this package's tests run at one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["evaluate", "ckpt.pt", "--all-prompts"], ExitCode.unreachable),
        (["doctor", "ckpt.pt"], ExitCode.unreachable),
        (["parity", "ckpt.pt", "--engine", _NOWHERE], ExitCode.engine),
    ],
)
def test_commands_that_walk_drafters_run_on_one_cpu_thread_by_default(
    argv: list[str], code: ExitCode, two_threads: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--server", _NOWHERE, "--device", "cpu"]) == code
    assert torch.get_num_threads() == 1


def test_threads_flag_and_environment(two_threads: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    argv = ["doctor", str(tmp_path / "ckpt.pt"), "--server", _NOWHERE, "--device", "cpu"]
    torch.set_num_threads(1)
    assert main([*argv, "--threads", "2"]) == ExitCode.unreachable
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("EVAL_WORKER_THREADS", "1")
    assert main(argv) == ExitCode.unreachable
    assert torch.get_num_threads() == 1
    assert main([*argv, "--threads", "-1"]) == ExitCode.usage


def test_omp_num_threads_and_zero_leave_torchs_own_choice() -> None:
    assert cpu_threads(EvaluateSettings(), {}) == 1
    assert cpu_threads(EvaluateSettings(), {"OMP_NUM_THREADS": "4"}) is None
    assert cpu_threads(EvaluateSettings(threads=0), {}) is None
    assert cpu_threads(EvaluateSettings(threads=3), {"OMP_NUM_THREADS": "4"}) == 3
