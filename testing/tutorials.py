"""The docs' tutorials run as written: every `bash` block of a page, in order, in one working directory,
against a real server on loopback, so that a page whose commands stopped working fails its test.

A page marks the blocks that do not simply run with an HTML comment on the line before the fence (a
reader sees neither): `<!-- tutorial: background -->` starts a server (the next blocks run once it
answers `/healthz`; it is stopped at the end) and `<!-- tutorial: skip (why) -->` leaves a block out (the
installation: the tests run in the installed environment). Every page speaks of port 8000
(`127.0.0.1:8000`, `--port 8000`); the tests put a free port there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testing.servers import free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PAGE_PORT = "8000"
_PORT = re.compile(rf"(?<=127\.0\.0\.1:){PAGE_PORT}\b|(?<=--port ){PAGE_PORT}\b")
_MARK = re.compile(r"<!-- tutorial: (background|skip \(.+\)) -->")
BLOCK_TIMEOUT_S = 300

How = Literal["run", "background", "skip"]


@dataclass(frozen=True)
class Block:
    """One `bash` block of a page, and how the test treats it."""

    how: How
    text: str


def shell_blocks(page: Path) -> list[Block]:
    """The page's `bash` blocks in order; ValueError on a marker that no `bash` block follows."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    previous = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        mark = _MARK.fullmatch(previous.strip())
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if line == "```bash":
                how: How = "run" if mark is None else "background" if mark[1] == "background" else "skip"
                blocks.append(Block(how, "\n".join(lines[i + 1 : end]) + "\n"))
            elif mark is not None:
                raise ValueError(f"{page.name}: `{previous.strip()}` is not followed by a bash block")
            i, previous = end + 1, ""
            continue
        if mark is not None and line.strip():
            raise ValueError(f"{page.name}: `{previous.strip()}` is not followed by a bash block")
        previous = line if line.strip() else previous
        i += 1
    return blocks


def on_port(text: str, port: int) -> str:
    """A block with the page's port 8000 replaced by `port`; ValueError where 8000 is left in another form."""
    moved = _PORT.sub(str(port), text)
    if PAGE_PORT in moved:
        raise ValueError(f"port {PAGE_PORT} in a form the test cannot move (127.0.0.1:8000, --port 8000): {text}")
    return moved


def environment(workdir: Path) -> dict[str, str]:
    """What a reader's shell has after the installation step: the environment's console scripts and
    `python` first on PATH, the clone importable (`python -m demo...`), and nothing written outside
    `workdir` (the worker's heads cache)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    python_path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": python_path, "EVAL_WORKER_HEADS_CACHE": str(workdir / "heads")}


@contextmanager
def _background(text: str, workdir: Path, env: dict[str, str], url: str, index: int) -> Iterator[None]:
    """A block's server, in a session of its own (the shell and what it started stop together)."""
    log = workdir / f"background-{index}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["bash", "-c", text], cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_healthy(url, proc, log, timeout_s=180)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_tutorial(page: Path, workdir: Path) -> list[str]:
    """Run `page`'s blocks in `workdir` as a reader would; each run block's output, in order.
    AssertionError naming the block and its output's end when one fails."""
    port = free_port()
    env = environment(workdir)
    outputs: list[str] = []
    with ExitStack() as servers:
        for index, block in enumerate(shell_blocks(page)):
            text = on_port(block.text, port)
            if block.how == "background":
                servers.enter_context(_background(text, workdir, env, f"http://127.0.0.1:{port}", index))
            elif block.how == "run":
                outputs.append(_run(text, workdir, env))
    return outputs


def _run(text: str, workdir: Path, env: dict[str, str]) -> str:
    argv = ["bash", "-euo", "pipefail", "-c", text]
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"this block exited {done.returncode}:\n{text}\n{output[-4000:]}"
    return output
