"""`/healthz` means it: 503 `server_unhealthy` once the compute loop is dead or the coordination
database has been away past `--unhealthy-after-s` (Postgres stopped, SQLite locked by another
process), 200 again once it is back, and nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from cache_server.api.app import build_service, create_app
from cache_server.compute.service import HiddenStateService
from cache_server.settings import ServeSettings
from testing.postgres import PostgresCluster, postgres_bin
from tests.cache_server.helpers import register_ready, serve_settings

DIES = 15  # a prompt starting with this token id ends the compute thread


class _Dies(BaseException):
    """Escapes every `except Exception`: the thread it is raised in ends."""


def _dying(settings: ServeSettings) -> HiddenStateService:
    service = build_service(settings)
    capture = service.target.capturer.capture

    def dying_capture(sequences: Any, *args: Any, **kwargs: Any) -> Any:
        if any(s[0] == DIES for s in sequences):
            raise _Dies
        return capture(sequences, *args, **kwargs)

    service.target.capturer.capture = dying_capture  # type: ignore[method-assign]
    return service


def _wait_status(client: TestClient, status: int, within_s: float) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    while (r := client.get("/healthz")).status_code != status:
        assert time.monotonic() - t0 < within_s, f"/healthz stayed {r.status_code} for {within_s} s: {r.text}"
        time.sleep(0.1)
    return r, time.monotonic() - t0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_compute_loop_makes_the_server_unhealthy(tiny_target: Path, tmp_path: Path) -> None:
    settings = serve_settings(tiny_target, tmp_path / "store", wait_s=0.2)
    with TestClient(create_app(settings, build=_dying)) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.post("/prompts", json={"prompts": [{"token_ids": [DIES, 5, 6]}]}).status_code == 202
        r, _ = _wait_status(client, 503, within_s=10)
    assert r.json()["error"] == {"code": "server_unhealthy", "message": "the compute loop has stopped"}


def test_the_database_away_and_back(tiny_target: Path, tmp_path: Path) -> None:
    if postgres_bin() is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Postgres (apt-get install postgresql)")
        pytest.skip("Postgres is not installed (apt-get install postgresql); CI runs these tests")
    cluster = PostgresCluster()
    cluster.start()
    bound = 1.0
    settings = serve_settings(tiny_target, tmp_path / "store", db=cluster.url, unhealthy_after_s=bound)
    try:
        with TestClient(create_app(settings)) as client:
            register_ready(client, [{"token_ids": [5, 6, 7]}])
            assert client.get("/healthz").status_code == 200
            cluster.stop()
            r, took = _wait_status(client, 503, within_s=bound + 5)
            message = r.json()["error"]["message"]
            assert "loop has failed for" in message and "OperationalError" in message
            cluster.start()
            _, back = _wait_status(client, 200, within_s=15)  # the next round after its backoff
            register_ready(client, [{"token_ids": [8, 9, 10]}])  # and it computes again
    finally:
        cluster.remove()
    print(f"503 {took:.1f} s after the database stopped (bound {bound} s), 200 {back:.1f} s after it returned")


# Another process takes SQLite's write lock: a server that died while holding a capture, then a
# process that keeps the database locked. Released by a line on its stdin.
_LOCKER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("UPDATE captures SET status = 'running', owner = 'gone', lease_expires_at = ?", (time.time() + 2,))
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


def test_a_sqlite_database_locked_and_released(tiny_target: Path, tmp_path: Path) -> None:
    bound = 1.0
    settings = serve_settings(tiny_target, tmp_path / "store", unhealthy_after_s=bound, db_lock_timeout_s=1.0)
    with TestClient(create_app(settings)) as client:
        (pid,) = register_ready(client, [{"token_ids": [5, 6, 7]}])
        db = tmp_path / "store" / "coordination.sqlite"
        locker = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
            # Its lease expires after 2 s; taking the capture over then waits 1 s for the lock and fails.
            r, took = _wait_status(client, 503, within_s=2 + bound + 8)
            message = r.json()["error"]["message"]
            assert message.startswith("the compute loop has failed for") and "database is locked" in message
        finally:
            locker.communicate("\n", timeout=10)
        _, back = _wait_status(client, 200, within_s=15)
        assert client.get(f"/prompts/{pid}").json()["status"] == "ready"  # taken over and closed: published
    print(f"503 {took:.1f} s after the database was locked, 200 {back:.1f} s after it was released")
