"""Capture work shared by servers, on SQLite and on Postgres: one claimer per prompt, leases renewed
and taken over, layers asked for meanwhile kept, failures kept until a prompt is registered again."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from cache_server.coordination.captures import CaptureQueue, CaptureState
from cache_server.coordination.database import Database


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def db(db_location: str) -> Database:
    return Database(db_location)


def request(queue: CaptureQueue, prompt_id: str, layers: list[int], *, retry_failed: bool = False) -> CaptureState:
    """One prompt's `request_many`."""
    return queue.request_many({prompt_id: layers}, retry_failed=retry_failed)[prompt_id]


def queue(db: Database, owner: str, clock: Clock | None = None, namespace: str = "fp") -> CaptureQueue:
    return CaptureQueue(db, namespace, owner, lease_s=10, max_attempts=3, now=clock or Clock())


def test_a_request_is_claimed_once_and_done(db: Database) -> None:
    a, b = queue(db, "a"), queue(db, "b")
    assert request(a, "p1", [2, 0]).status == "queued"
    request(a, "p1", [1])  # still queued: grows
    claimed = b.claim()
    assert claimed is not None and (claimed.prompt_id, claimed.layers, claimed.attempts) == ("p1", (0, 1, 2), 1)
    assert a.claim() is None and b.claim() is None
    assert a.state("p1").owner == "b"  # type: ignore[union-attr]
    assert not a.done("p1")  # not a's to finish
    assert b.done("p1")
    state = a.state("p1")
    assert state is not None and (state.status, state.published) == ("done", True)
    assert queue(db, "c", namespace="other").state("p1") is None  # namespaces never mix


def test_layers_asked_for_while_running_are_queued_when_it_ends(db: Database) -> None:
    a, b = queue(db, "a"), queue(db, "b")
    request(a, "p1", [0])
    assert a.claim() is not None
    request(b, "p1", [0])  # covered by the running capture: nothing new
    request(b, "p1", [5])
    assert b.claim() is None
    assert a.done("p1")
    again = b.claim()
    assert again is not None and again.layers == (5,)
    assert b.done("p1")
    assert a.state("p1").status == "done"  # type: ignore[union-attr]


def test_an_expired_lease_is_taken_over_and_renewing_keeps_it(db: Database) -> None:
    clock = Clock()
    a, b = queue(db, "a", clock), queue(db, "b", clock)
    request(a, "p1", [0])
    assert a.claim() is not None
    clock.t += 9
    a.renew(["p1"])
    clock.t += 9  # 18 s after the claim, 9 after the renewal
    assert b.claim() is None
    clock.t += 2
    taken = b.claim()
    assert taken is not None and taken.attempts == 2
    assert not a.done("p1")  # the dead server's late result is not recorded
    assert b.done("p1")


def test_a_capture_that_keeps_losing_its_server_fails_after_max_attempts(db: Database) -> None:
    clock = Clock()
    q = queue(db, "a", clock)
    request(q, "p1", [0])
    for _ in range(3):
        assert q.claim() is not None
        clock.t += 11
    assert q.claim() is None
    state = q.state("p1")
    assert state is not None and state.status == "failed" and "3 attempts" in (state.error or "")


def test_failures_stay_until_registered_again_and_release_gives_work_back(db: Database) -> None:
    a, b = queue(db, "a"), queue(db, "b")
    request(a, "p1", [0])
    assert a.claim() is not None
    a.fail("p1", "RuntimeError: out of memory")
    assert request(a, "p1", [0]).status == "failed"  # a /hidden does not retry it
    assert request(a, "p1", [0], retry_failed=True).status == "queued"  # a registration does
    assert a.claim() is not None
    a.release(["p1"])  # shutting down: another server takes it at once
    taken = b.claim()
    assert taken is not None and taken.attempts == 1


def test_racing_claimers_on_two_connections_never_share_a_capture(db_location: str) -> None:
    dbs = [Database(db_location), Database(db_location)]  # as two server processes
    request(queue(dbs[0], "setup"), "warm", [0])
    for i in range(30):
        queue(dbs[0], "setup").request_many({f"p{i}": [0]})
    got: Counter[str] = Counter()
    lock = threading.Lock()

    def claim_all(n: int) -> None:
        q = queue(dbs[n % 2], f"w{n}")
        while (c := q.claim()) is not None:
            with lock:
                got[c.prompt_id] += 1
            assert q.done(c.prompt_id)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(claim_all, range(6)))
    assert got == Counter({f"p{i}": 1 for i in range(30)} | {"warm": 1})
