"""Wake-ups between servers: a transaction that queues or finishes capture work says so, and the
waiters and idle compute loops of every server wake at once instead of polling the database.

On Postgres a notice is a `NOTIFY` sent inside the transaction, so it reaches every server's
`LISTEN` connection exactly when the change commits (and never for a rollback). SQLite has no such
channel: its notices reach this process's listeners after the commit, and servers in other processes
see the change when they next poll."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from sqlalchemy import Connection, func, select

log = logging.getLogger(__name__)

CHANNEL = "hidden_state_cache"
_PENDING = "hidden_state_cache_notices"  # a connection's notices awaiting its commit (SQLite)
_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.5, 10.0


@dataclass(frozen=True)
class Notice:
    """Capture work in `namespace` was queued, or a prompt's capture finished (published or failed)."""

    kind: Literal["queued", "finished"]
    namespace: str
    prompt_id: str | None = None


Listener = Callable[[Notice], None]


class Notices:
    """The notices of one database: `send` inside a transaction, `listen` to receive them all.

    `conninfo` is a libpq connection string for Postgres (one extra connection, listening), None for
    SQLite. `crosses_processes` says whether other servers' notices arrive here too."""

    def __init__(self, conninfo: str | None) -> None:
        self._conninfo = conninfo
        self.crosses_processes = conninfo is not None
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, c: Connection, notice: Notice) -> None:
        """Say `notice` when the transaction of `c` commits."""
        if self.crosses_processes:
            c.execute(select(func.pg_notify(CHANNEL, json.dumps(asdict(notice)))))
        else:
            c.info.setdefault(_PENDING, []).append(notice)

    def committed(self, c: Connection) -> None:
        """The transaction of `c` committed: deliver what it said here (SQLite)."""
        for notice in c.info.pop(_PENDING, ()):
            self._deliver(notice)

    def rolled_back(self, c: Connection) -> None:
        """The transaction of `c` rolled back: what it said never happened."""
        c.info.pop(_PENDING, None)

    def listen(
        self, listener: Listener, *, ok: Callable[[], None], failing: Callable[[Exception], None]
    ) -> threading.Thread | None:
        """Call `listener` with every notice from now on; on Postgres the listening thread (reporting
        each connection's success to `ok` and each failure to `failing`), started on the first call."""
        with self._lock:
            self._listeners.append(listener)
            if self._conninfo is None or self._thread is not None:
                return self._thread
            self._thread = threading.Thread(
                target=self._listen_loop, args=(self._conninfo, ok, failing), name="db-notices", daemon=True
            )
            self._thread.start()
            return self._thread

    def close(self) -> None:
        """Stop listening."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _deliver(self, notice: Notice) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(notice)

    def _listen_loop(self, conninfo: str, ok: Callable[[], None], failing: Callable[[Exception], None]) -> None:
        import psycopg  # the Postgres driver (the `[postgres]` extra), present whenever conninfo is

        backoff = _FIRST_BACKOFF_S
        while not self._stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    backoff = _FIRST_BACKOFF_S
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0):
                            self._deliver(Notice(**json.loads(n.payload)))
                        ok()  # at least once a second while the connection holds
            except Exception as e:  # the database away: waiters poll meanwhile; reconnect with backoff
                failing(e)
                log.warning("database notices: %s (reconnecting in %.1f s)", e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
