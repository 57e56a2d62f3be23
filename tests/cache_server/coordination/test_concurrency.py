"""What lets servers share one database without queueing on each other, on SQLite and on Postgres:
reads wait on no writer, claims skip work another server is taking (Postgres), and a change that
queues or finishes work is announced to every server (Postgres: to other processes too; never for
a transaction that rolled back)."""

from __future__ import annotations

import queue as queues
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database
from cache_server.coordination.notices import Notice
from cache_server.coordination.tables import CAPTURES
from testing.postgres import fresh_database


@pytest.fixture
def db(db_location: str) -> Iterator[Database]:
    db = Database(db_location)
    yield db
    db.close()


def _holding(db: Database, ordered: bool, hold: threading.Event, held: threading.Event, **lock_row: str) -> None:
    """A write transaction that stays open until `hold` is set (locking one capture row if asked)."""
    with db.transaction(ordered=ordered) as c:
        if lock_row:
            c.execute(select(CAPTURES).where(CAPTURES.c.prompt_id == lock_row["prompt_id"]).with_for_update())
        held.set()
        hold.wait(30)


def test_reads_do_not_wait_for_an_open_write(db: Database) -> None:
    captures = CaptureQueue(db, "fp", "a")
    captures.request_many({"p1": [0]})
    hold, held = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as pool:
        writer = pool.submit(_holding, db, True, hold, held)
        assert held.wait(10)
        try:
            reader = pool.submit(captures.states)
            assert reader.result(timeout=5)["p1"].status == "queued"  # while the write is still open
        finally:
            hold.set()
        writer.result()


def test_a_claim_skips_a_capture_another_server_has_locked(postgres_url: str) -> None:
    # Postgres only: SQLite serializes its writers, so there is no second writer to skip past.
    location = fresh_database(postgres_url, f"t_{uuid.uuid4().hex[:12]}")
    db = Database(location)
    a, b = CaptureQueue(db, "fp", "a"), CaptureQueue(Database(location), "fp", "b")
    a.request_many({"p1": [0]})
    a.request_many({"p2": [0]})
    hold, held = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as pool:
        locker = pool.submit(_holding, db, False, hold, held, prompt_id="p1")
        assert held.wait(10)
        try:
            claimed = pool.submit(b.claim).result(timeout=5)  # not waiting for p1's lock, nor a global one
            assert claimed is not None and claimed.prompt_id == "p2"
        finally:
            hold.set()
        locker.result()
    b.db.close()
    db.close()


def test_notices_say_what_was_queued_and_finished_once_committed(db_location: str, db: Database) -> None:
    # A second Database is a second server: on Postgres its notices travel through the database.
    other = Database(db_location) if db_location.startswith("postgresql") else db
    heard: queues.Queue[Notice] = queues.Queue()
    connected = threading.Event()
    other.notices.listen(heard.put, ok=connected.set, failing=lambda e: None)
    assert connected.wait(10) or not other.notices.crosses_processes
    captures = CaptureQueue(db, "fp", "a")
    captures.request_many({"p1": [0]})
    assert heard.get(timeout=10) == Notice("queued", "fp")
    captures.request_many({"p1": [1]})  # merged into the queued capture: nothing new to claim
    with pytest.raises(RuntimeError), db.transaction() as c:  # said, then rolled back: never heard
        db.notices.send(c, Notice("queued", "rolled-back"))
        raise RuntimeError
    assert captures.claim() is not None
    assert captures.done("p1")
    assert heard.get(timeout=10) == Notice("finished", "fp", "p1")
    assert heard.empty()
    if other is not db:
        other.close()
