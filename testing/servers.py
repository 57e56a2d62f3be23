"""Servers for tests, benches and the demo, on loopback: `cache-server serve` (or a bench's) as a
child process, or an app served in this process."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes] | None,
    log: Path | None,
    timeout_s: float = 60.0,
    *,
    path: str = "/healthz",
) -> None:
    """Until `url + path` answers 200; RuntimeError with the log's tail if the process (when it is
    ours) exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-4000:] if log is not None else ""
            raise RuntimeError(f"the server for {url} exited with {proc.returncode}: {tail}")
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None else ""
            raise TimeoutError(f"{url} did not become healthy in {timeout_s:.0f} s: {tail}")
        time.sleep(0.2)


@contextmanager
def running_child(
    cmd: list[str], port: int, log: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[str]:
    """Runs `cmd`, a server on loopback `port`; yields its URL once `/healthz` answers, and
    terminates it (SIGTERM, then SIGKILL) on exit.

    Its output goes to `log` (a file, not a pipe nobody drains, which would block it)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_command(model: Path, store: Path | str, port: int, *extra: str) -> list[str]:
    """The `cache-server serve` command line every test and bench starts: on CPU, on loopback `port`,
    logging warnings, with `extra` options after."""
    cmd = [sys.executable, "-m", "cache_server.cli", "serve", "--model", str(model), "--store", str(store)]
    return [*cmd, "--port", str(port), "--device", "cpu", "--log-level", "warning", *extra]


@contextmanager
def running_server(
    model: Path, store: Path, *extra: str, env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[str]:
    """`cache-server serve` on CPU over `model` and `store`; yields its URL. Its output goes to `<store>.log`."""
    port = port or free_port()
    with running_child(
        serve_command(model, store, port, *extra), port, store.with_name(store.name + ".log"), env=env
    ) as url:
        yield url


@contextmanager
def serving_app(app: Any) -> Iterator[str]:
    """Serve an ASGI app in this process with the server's own HTTP protocol, on a loopback port, in
    a thread; yields its URL. For tests that inject a service (`create_app(build=...)`) but still
    want real HTTP between client and server."""
    import threading

    import uvicorn

    from cache_server.api.http_protocol import JsonErrorHttpProtocol

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=JsonErrorHttpProtocol)
    )
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


HIDDEN_REQUESTS = "cache_server_hidden_requests_total"


def server_metric(url: str, name: str) -> float:
    """The value of one Prometheus metric of a running server."""
    text = httpx.get(f"{url}/metrics").text
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    if match is None:
        raise KeyError(f"{name} not in {url}/metrics")
    return float(match.group(1))
