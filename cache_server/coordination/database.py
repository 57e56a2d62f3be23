"""The coordination database, through SQLAlchemy Core so every query is written once for both engines:
SQLite (a file: the zero-setup default for the servers of one node) or Postgres (servers on many
nodes, `--db postgresql://user:pass@host/db`).

Three kinds of transaction, so that servers wait on each other only where they must:
- `read()`: a consistent snapshot that takes no lock (SQLite WAL readers never wait on a writer;
  Postgres `REPEATABLE READ, READ ONLY`).
- `transaction()`: a write. SQLite serializes writes (`BEGIN IMMEDIATE`, this process's threads
  queueing on a lock rather than in SQLite's busy wait); on Postgres a write locks only the rows it
  touches (`SELECT ... FOR UPDATE`, claims with `SKIP LOCKED`), so servers claim in parallel.
- `transaction(ordered=True)`: a write that appends rows numbered by `seq` (`max_seq`); on Postgres
  these take one advisory lock, so `seq` is unique and commits in its order, and a server catching
  up past the last `seq` it saw never skips a row.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, Select, Table, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.sql.schema import Column

from cache_server.coordination.notices import Notices
from cache_server.coordination.schema import prepare_schema

_ADVISORY_LOCK = 0x6873_6300  # the Postgres advisory lock of ordered transactions
_READ = "hidden_state_cache_read"  # execution option: this connection begins a read-only transaction


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
    """An engine for `location` with the coordination schema created or migrated, and its notices.
    `lock_timeout_s`: how long a SQLite statement waits for another process's lock before it fails."""

    def __init__(self, location: str, *, lock_timeout_s: float = 30.0) -> None:
        url = make_url(database_url(location))
        self.dialect = url.get_backend_name()
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None
        if self.dialect == "sqlite":
            if url.database:
                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_engine(url, connect_args={"timeout": lock_timeout_s, "check_same_thread": False})
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
            self.notices = Notices(None)
        elif self.dialect == "postgresql":
            try:
                import psycopg  # noqa: F401  (the driver the URL names)
            except ImportError:
                raise ValueError(
                    f"database {location!r} needs psycopg: pip install 'hidden-state-cache[postgres]'"
                ) from None
            self.engine = create_engine(url, pool_pre_ping=True)
            self.notices = Notices(url.set(drivername="postgresql").render_as_string(hide_password=False))
        else:
            raise ValueError(f"database {location!r}: only SQLite and Postgres are supported")
        self.location = url.render_as_string(hide_password=True)
        with self.transaction(ordered=True) as c:  # serialized: concurrent first opens do not race
            self.opened_at_version = prepare_schema(c, self.location)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A consistent read-only snapshot that waits on no writer."""
        options: dict[str, Any] = {_READ: True}
        if self.dialect == "postgresql":
            options.update(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with self.engine.connect().execution_options(**options) as c, c.begin():
            yield c

    def any(self, query: Select[Any]) -> bool:
        """Whether `query` finds a row, in a lock-free read: the look before a write that usually finds
        nothing to do (an idle claim), so that such polls never take a write lock."""
        with self.read() as c:
            return c.execute(query.limit(1)).first() is not None

    @contextmanager
    def transaction(self, *, ordered: bool = False) -> Iterator[Connection]:
        """One write transaction, committed on success and rolled back on any error; `ordered` for one
        that appends rows by `seq`. Notices sent in it are delivered once it commits."""
        lock: AbstractContextManager[Any] = self._write_lock if self._write_lock is not None else nullcontext()
        with lock, self.engine.connect() as c:
            try:
                with c.begin():
                    if ordered and self.dialect == "postgresql":
                        c.execute(select(func.pg_advisory_xact_lock(_ADVISORY_LOCK)))
                    yield c
            except BaseException:
                self.notices.rolled_back(c)
                raise
            self.notices.committed(c)

    def close(self) -> None:
        """Stop listening for notices and close the pooled connections."""
        self.notices.close()
        self.engine.dispose()


def max_seq(c: Connection, seq: Column[int], *where: ColumnElement[bool]) -> int:
    """The largest `seq` of the rows matching `where` (0 if none): inside an ordered transaction,
    `max_seq + 1` is the next insertion's place, so every table's `seq` is its insertion order."""
    found: int = c.execute(select(func.coalesce(func.max(seq), 0)).where(*where)).scalar_one()
    return found


def rows_after(db: Database, table: Table, namespace: str, seen: int, *columns: Column[Any]) -> Sequence[Row[Any]]:
    """`columns` (and `seq`) of a namespace's rows added after `seq` `seen`, in insertion order: how a
    server catches up with what every server appended to a prompt-side table."""
    with db.read() as c:
        query = select(table.c.seq, *columns).where(table.c.namespace == namespace, table.c.seq > seen)
        return c.execute(query.order_by(table.c.seq)).all()


def _sqlite_connect(dbapi_connection: Any, _record: object) -> None:
    dbapi_connection.isolation_level = None  # transactions are begun by `_sqlite_begin`
    dbapi_connection.execute("PRAGMA journal_mode = WAL")
    dbapi_connection.execute("PRAGMA synchronous = FULL")  # a stored report survives a power cut too


def _sqlite_begin(conn: Connection) -> None:
    # A reader takes its snapshot at its first read; a writer takes the write lock at once, so two
    # writers never both read and then fail to upgrade.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ) else "BEGIN IMMEDIATE")
