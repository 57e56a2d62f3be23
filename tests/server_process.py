"""Run a real `cache-server serve` process on a free loopback port for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(model: Path, store: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "cache_server.cli", "serve", "--model", str(model), "--store", str(store)]
    cmd += ["--port", str(port), "--device", "cpu", "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"cache-server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
                )
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("cache-server did not become healthy in 60 s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
