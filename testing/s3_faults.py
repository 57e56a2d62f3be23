"""The S3 counterpart of `crash_states.py`: a fault layer over a store's objects that stops a workload
at each of its writes in turn, and the same check of what the store shows afterwards.

S3 has no fsync and no partial object: an acknowledged PUT (or DELETE) is durable, and one in flight
when the writer died either happened or did not. So the states a crash may leave are: the first n
writes happened, and the writer, at write n, saw an error (`lost`: it never reached the store;
`unacknowledged`: it was applied, the reply was lost) and stopped. `swallowed` is a broken protocol
for the check to catch: the write is lost and the writer, told it succeeded, carries on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cache_server.store.blobs import Blobs, ReadsOf
from testing.store_check import Version, Workload, allowed_after, check_store, open_store

MODES = ("lost", "unacknowledged")  # what a crash may do; "swallowed" breaks the protocol


class FaultyBlobs(ReadsOf):
    """`inner`, except that once `armed`, write number `at` (PUTs and DELETEs, counted from 0) fails
    as `mode` says, and so does every write after it (the writer is dead)."""

    def __init__(self, inner: Blobs, at: int | None = None, mode: str = "lost") -> None:
        super().__init__(inner)
        self.at, self.mode = at, mode
        self.armed = False
        self.writes = 0  # counted once armed

    def _write(self, what: str, apply: Callable[[], None]) -> None:
        if not self.armed:
            apply()
            return
        n, self.writes = self.writes, self.writes + 1
        if n == self.at and self.mode == "swallowed":
            return
        if self.at is not None and n >= self.at and self.mode != "swallowed":
            if n == self.at and self.mode == "unacknowledged":
                apply()
            raise OSError(f"injected fault at write {n} ({what}, {self.mode})")
        apply()

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """A PUT, faulted at its point."""
        self._write(f"PUT {key}", lambda: self.inner.put(key, data, create=create))

    def delete(self, prefix: str) -> None:
        """A DELETE, faulted at its point."""
        self._write(f"DELETE {prefix}", lambda: self.inner.delete(prefix))


@dataclass
class FaultRun:
    """What the fault points of a workload covered and found."""

    writes: int = 0  # the workload's writes, each a fault point
    points: int = 0  # (write, mode) pairs run
    failures: list[str] = field(default_factory=list)


def _run(workload: Workload, blobs: Blobs, at: int | None, mode: str) -> tuple[int, dict[str, Version], str]:
    """The workload on `blobs` (set up without faults) faulted at write `at`: its writes, the steps
    acknowledged and the error that stopped it."""
    with open_store(blobs) as store:
        workload.setup(store)
    faulty = FaultyBlobs(blobs, at, mode)
    acked: dict[str, Version] = {}
    stopped = ""
    with open_store(faulty) as store:
        faulty.armed = True
        try:
            workload.act(store, acked.__setitem__)
        except Exception as e:  # the writer sees the fault (or what it caused) and stops
            stopped = f"{type(e).__name__}: {e}"
    return faulty.writes, acked, stopped


def explore_faults(workload: Workload, fresh: Callable[[], Blobs], modes: Sequence[str] = MODES) -> FaultRun:
    """Run `workload` on a `fresh()` store once per write and mode, faulted there, and check the store."""
    found = FaultRun()
    found.writes, _, stopped = _run(workload, fresh(), None, "lost")
    if stopped:
        raise RuntimeError(f"{workload.name} fails without faults: {stopped}")
    for at in range(found.writes):
        for mode in modes:
            blobs = fresh()
            _, acked, stopped = _run(workload, blobs, at, mode)
            found.points += 1
            problems = check_store(blobs, allowed_after(workload, acked))
            if not stopped and mode != "swallowed":
                problems.append("the fault was not seen")
            if problems:
                found.failures.append(f"{workload.name}, write {at} {mode} ({stopped}): {problems}")
    return found
