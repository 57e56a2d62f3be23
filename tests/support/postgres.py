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

from tests.support.servers import free_port


def postgres_bin() -> Path | None:
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_server() -> Iterator[str]:
    """Starts a fresh cluster on 127.0.0.1; yields its `postgresql://` URL (trust auth, loopback only)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise FileNotFoundError("Postgres is not installed (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="hsc-postgres-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()
    subprocess.run(_as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
                   check=True, capture_output=True)  # fmt: skip
    log = (root / "postgres.log").open("ab")
    proc = subprocess.Popen(
        _as_postgres([str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                      "-k", str(root), "-c", "fsync=off", "-c", "max_connections=200"]),
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True).returncode != 0:  # fmt: skip
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {(root / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server at `url`; its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine("postgresql+psycopg://" + url.split("://", 1)[1], isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url.rsplit("/", 1)[0] + f"/{name}"
