"""The coordination database, through SQLAlchemy Core so every query is written once for both engines:
SQLite (a file: the zero-setup default for the servers of one node) or Postgres (servers on many
nodes, `--db postgresql://user:pass@host/db`).

Every state change runs in one serialized transaction (`transaction()`): `BEGIN IMMEDIATE` on SQLite,
a transaction-scoped advisory lock on Postgres. The coordination tables are small and their
transactions short, so serializing them costs little and makes every claim and lease check exact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Connection, MetaData, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.sql.schema import Column

METADATA = MetaData()
_ADVISORY_LOCK = 0x6873_6300  # one Postgres advisory lock id for every coordination transaction


def database_url(location: str) -> str:
    """A SQLAlchemy URL: `postgresql://` (psycopg 3), `sqlite:///path`, or a plain path (SQLite)."""
    if location.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + location.split("://", 1)[1]
    if location.startswith(("postgresql+", "sqlite:")):
        return location
    if "://" in location:
        raise ValueError(f"database {location!r}: use a SQLite path, sqlite:///path or postgresql://...")
    return f"sqlite:///{Path(location).resolve()}"


class Database:
    """An engine for `location` with the coordination tables created (idempotently)."""

    def __init__(self, location: str) -> None:
        url = make_url(database_url(location))
        self.dialect = url.get_backend_name()
        self._lock = threading.Lock()  # this process's threads queue here, not in the engine's busy waits
        if self.dialect == "sqlite":
            if url.database:
                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_engine(url, connect_args={"timeout": 30.0, "check_same_thread": False})
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        elif self.dialect == "postgresql":
            try:
                import psycopg  # noqa: F401  (the driver the URL names)
            except ImportError:
                raise ValueError(
                    f"database {location!r} needs psycopg: pip install 'hidden-state-cache[postgres]'"
                ) from None
            self.engine = create_engine(url, pool_pre_ping=True)
        else:
            raise ValueError(f"database {location!r}: only SQLite and Postgres are supported")
        self.location = url.render_as_string(hide_password=True)
        with self.transaction() as c:  # serialized: concurrent first opens do not race
            METADATA.create_all(c)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One serialized transaction, committed on success and rolled back on any error."""
        with self._lock, self.engine.begin() as c:
            if self.dialect == "postgresql":
                c.execute(select(func.pg_advisory_xact_lock(_ADVISORY_LOCK)))
            yield c

    def close(self) -> None:
        """Close the pooled connections."""
        self.engine.dispose()


def max_seq(c: Connection, seq: Column[int], *where: ColumnElement[bool]) -> int:
    """The largest `seq` of the rows matching `where` (0 if none): inside a serialized transaction,
    `max_seq + 1` is the next insertion's place, so every table's `seq` is its insertion order."""
    found: int = c.execute(select(func.coalesce(func.max(seq), 0)).where(*where)).scalar_one()
    return found


def _sqlite_connect(dbapi_connection: Any, _record: object) -> None:
    dbapi_connection.isolation_level = None  # transactions are begun by the "begin" event above
    dbapi_connection.execute("PRAGMA journal_mode = WAL")
    dbapi_connection.execute("PRAGMA synchronous = FULL")  # a stored report survives a power cut too
