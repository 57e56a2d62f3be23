"""Schemathesis fuzzes every route of a real server from its own `/openapi.json`: no status the
document does not declare, and no 500."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing.servers import running_server

pytestmark = pytest.mark.slow


def test_no_route_answers_what_its_document_does_not_declare(tiny_target: Path, tmp_path: Path) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli is not None, "schemathesis is a dev dependency"
    root = tmp_path / "checkpoints"
    root.mkdir()
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root)) as url:
        done = subprocess.run(
            [
                cli,
                "run",
                f"{url}/openapi.json",
                "--checks",
                "status_code_conformance,not_a_server_error",
                "--max-examples",
                "40",
                "--seed",
                "1",
                "--workers",
                "1",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stdout[-6000:]
