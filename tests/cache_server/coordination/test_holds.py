"""A prune's hold on a prompt's capture lease, on SQLite and on Postgres: refused while a capture runs,
a capture never claimed while it is held (what is asked meanwhile is queued at the release), the
prompt's state given back as it was, and a dead prune's hold taken over like a dead server's."""

from __future__ import annotations

import pytest

from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database
from cache_server.coordination.holds import PromptHolds
from tests.cache_server.coordination.test_captures import Clock, request


@pytest.fixture
def db(db_location: str) -> Database:
    return Database(db_location)


def _pair(db: Database, clock: Clock) -> tuple[CaptureQueue, PromptHolds]:
    server = CaptureQueue(db, "fp", "server", lease_s=10, max_attempts=3, now=clock)
    return server, PromptHolds(db, "fp", "prune", lease_s=5, now=clock)


def test_a_hold_waits_for_a_running_capture_and_a_capture_waits_for_the_hold(db: Database) -> None:
    clock = Clock()
    server, prune = _pair(db, clock)
    request(server, "p", [0, 1])
    assert server.claim() is not None
    assert not prune.hold("p")  # a capture runs: the prune tries again later
    assert server.done("p")
    assert prune.hold("p")
    assert request(server, "p", [4]).status == "running"  # asked meanwhile: waits for the release
    assert server.claim() is None
    assert server.unwritten() == {"p": (4,)}
    prune.release("p")
    claimed = server.claim()
    assert claimed is not None and claimed.layers == (4,)
    assert server.done("p")
    assert server.state("p").status == "done"  # type: ignore[union-attr]


def test_a_held_prompt_goes_back_where_it_was(db: Database) -> None:
    clock = Clock()
    server, prune = _pair(db, clock)
    assert prune.hold("imported")  # published before the database knew it: a row is made, done after
    prune.release("imported")
    state = server.state("imported")
    assert state is not None and (state.status, state.published) == ("done", True)
    request(server, "queued", [2, 3])
    assert prune.hold("queued")
    assert server.claim() is None
    prune.release("queued")
    assert server.state("queued").status == "queued"  # type: ignore[union-attr]
    claimed = server.claim()
    assert claimed is not None and claimed.layers == (2, 3)
    server.fail("queued", "boom")
    assert prune.hold("queued")
    prune.release("queued")
    state = server.state("queued")
    assert state is not None and (state.status, state.error) == ("failed", "boom")


def test_a_dead_prunes_hold_expires_and_is_taken_over(db: Database) -> None:
    clock = Clock()
    server, prune = _pair(db, clock)
    request(server, "p", [1])
    assert prune.hold("p")
    assert server.claim() is None
    clock.t += 6  # the prune died holding it: its lease ran out
    claimed = server.claim()
    assert claimed is not None and claimed.layers == (1,)
    prune.release("p")  # a late release changes nothing: the server holds it now
    assert server.state("p").owner == "server"  # type: ignore[union-attr]
    assert not prune.hold("p")
    assert server.done("p")
