"""`eval-worker`'s exit codes: a usage error is 2 wherever it comes from (argparse's bad flag, the
command's own checks), as `cache-server` exits, and `--help` says what each status means."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode, exit_codes_line


def test_a_bad_flag_and_a_bad_value_both_exit_with_the_usage_status(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--no-such-flag"])
    assert e.value.code == ExitCode.usage == 2
    argv = ["parity", str(tmp_path / "ckpt"), "--engine", "http://127.0.0.1:9", "--server", "http://127.0.0.1:9"]
    assert main([*argv, "--limit", "0"]) == ExitCode.usage


def test_help_names_every_status_once() -> None:
    line = exit_codes_line()
    assert "2 bad usage" in line and "3 checkpoint refused" in line and "1 parity: a prompt disagrees" in line
    assert len({int(c) for c in ExitCode}) == len(ExitCode)  # no status means two things
