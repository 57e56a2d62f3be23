"""A Postgres server on loopback for tests and benches: Debian's `postgresql` package (installed by
.ci/run), a throwaway cluster started as the `postgres` user when running as root (Postgres refuses
to run as root), stopped and deleted afterwards."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testing.servers import free_port


def postgres_bin() -> Path | None:
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PostgresCluster:
    """A fresh cluster on a loopback port (trust auth), which can be stopped and started again on the
    same port and data (the database going away under a running server)."""

    def __init__(self) -> None:
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise FileNotFoundError("Postgres is not installed (apt-get install postgresql)")
        self._bin, self.root = bin_dir, Path(tempfile.mkdtemp(prefix="hsc-postgres-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._data, self.port = self.root / "data", free_port()
        subprocess.run(
            _as_postgres([str(bin_dir / "initdb"), "-D", str(self._data), "-A", "trust", "-U", "postgres"]),
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        with (self.root / "postgres.log").open("ab") as log:
            self._proc = subprocess.Popen(
                _as_postgres(
                    [
                        str(self._bin / "postgres"),
                        "-D",
                        str(self._data),
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(self.port),
                        "-k",
                        str(self.root),
                        "-c",
                        "fsync=off",
                        "-c",
                        "max_connections=200",
                    ]
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                [str(self._bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
            ).returncode
            != 0
        ):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {(self.root / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are cut)."""
        if self._proc is not None:
            if self._proc.poll() is None:  # the postmaster, not `runuser` above it, decides when it is down
                subprocess.run(
                    _as_postgres([str(self._bin / "pg_ctl"), "-D", str(self._data), "-m", "fast", "-w", "stop"]),
                    capture_output=True,
                    timeout=60,
                )
            self._proc.wait(timeout=30)
            self._proc = None

    def remove(self) -> None:
        """Stop the server and delete the cluster."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Starts a fresh cluster on 127.0.0.1; yields its `postgresql://` URL (trust auth, loopback only)."""
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.remove()


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server at `url`; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine("postgresql+psycopg://" + url.split("://", 1)[1], isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url.rsplit("/", 1)[0] + f"/{name}"
