"""A crash-state explorer for the local store (after ALICE and CrashMonkey): every disk state a power
loss may leave while a workload runs, each materialised in a fresh directory and checked.

Persistence model (POSIX, with nothing a particular file system adds):

- The directory before the workload is durable. The workload's operations are logged in order
  (`file_ops_log.RecordingOps`); a crash point is any prefix of that log.
- A file's data is durable once the file (the same inode, under any name) is fsynced after it was
  written; until then it may be lost, and the file, if its name survives, is empty. So a rename
  whose target's data was not fsynced may leave an empty file under the final name.
- An operation on a directory's entries (create, rename, link, unlink, mkdir, rmdir) is durable once
  that directory (each one, for a rename across two) is fsynced after it; until then it may be lost,
  independently of every other pending operation: any subset of the pending ones, in any order.
  fsync of a directory does not make its own entry in its parent durable.
- What a lost operation made unreachable is gone with it: a file written into a directory whose
  mkdir was lost, a rename of a file whose creation was lost. A removed directory takes what was
  under it.

Not modelled: a file's data torn part-way (unsynced data is all there or none: the checksums in the
layers' zarr.json and the manifest catch a torn one as they catch an empty one), and losses beyond the
last fsync of what was synced (a lying disk).

At a crash point with n pending operations, every subset of them is lost in turn when n <= 10;
beyond, none and all of them, each one alone, all but each one, and a seeded sample of 48. States
that come out identical are checked once.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from testing.file_ops_log import ENTRY_KINDS, Op

Event = tuple[str, int]  # ("entry" | "data", index of the op in the log)


@dataclass(frozen=True)
class Disk:
    """A directory tree in memory: its directories and its files' bytes, by relative path."""

    dirs: frozenset[str]
    files: tuple[tuple[str, bytes], ...]  # sorted by path


def snapshot(root: Path) -> Disk:
    """The tree under `root` as it is."""
    dirs = frozenset(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir())
    files = tuple(sorted((p.relative_to(root).as_posix(), p.read_bytes()) for p in root.rglob("*") if p.is_file()))
    return Disk(dirs | {"."}, files)


def materialise(disk: Disk, root: Path) -> None:
    """Write `disk` out under `root` (a new directory)."""
    root.mkdir(parents=True)
    for d in sorted(disk.dirs, key=lambda d: d.count("/")):
        (root / d).mkdir(exist_ok=True)
    for path, data in disk.files:
        (root / path).write_bytes(data)


@contextmanager
def scratch(fallback: Path) -> Iterator[Path]:
    """A directory to materialise states in: in RAM (/dev/shm) where there is one, since directory
    operations on a disk cost milliseconds each (25 ms a state here); else `fallback`."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    where = Path(tempfile.mkdtemp(prefix="crash-states-", dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _parent(path: str) -> str:
    return Path(path).parent.as_posix()


def _dirs_touched(op: Op) -> set[str]:
    if op.kind == "rename":
        return {_parent(op.path), _parent(op.dst)}
    return {_parent(op.dst if op.kind == "link" else op.path)}


def _fsynced_inodes(log: Sequence[Op], end: int) -> dict[int, int]:
    """Each fsync of `log[:end]` (by index) -> the inode it made durable (the index of the write that
    made the file), following the names through renames, links and unlinks."""
    names: dict[str, int] = {}  # the inode each name holds
    synced_inode: dict[int, int] = {}
    for k, op in enumerate(log[:end]):
        if op.kind == "write":
            names[op.path] = k
        elif op.kind == "rename" and op.path in names:
            names[op.dst] = names.pop(op.path)
        elif op.kind == "link" and op.path in names:
            names[op.dst] = names[op.path]
        elif op.kind == "unlink":
            names.pop(op.path, None)
        elif op.kind == "fsync" and op.path in names:
            synced_inode[k] = names[op.path]
    return synced_inode


def pending(log: Sequence[Op], end: int) -> list[Event]:
    """The events of `log[:end]` a power loss at `end` may undo: entries not yet fsynced into their
    directories, data not yet fsynced."""
    synced_inode = _fsynced_inodes(log, end)
    dirs_synced: set[str] = set()
    inodes_synced: set[int] = set()
    found: list[Event] = []
    for k in range(end - 1, -1, -1):  # backwards: what is fsynced after each op
        op = log[k]
        if op.kind == "fsync_dir":
            dirs_synced.add(op.path)
        elif op.kind == "fsync" and k in synced_inode:
            inodes_synced.add(synced_inode[k])
        if op.kind in ENTRY_KINDS and not _dirs_touched(op) <= dirs_synced:
            found.append(("entry", k))
        if op.kind == "write" and k not in inodes_synced:
            found.append(("data", k))
    return sorted(found, key=lambda e: (e[1], e[0]))


def replay(base: Disk, log: Sequence[Op], end: int, lost: frozenset[Event]) -> Disk:
    """The disk after `log[:end]` with the `lost` events undone."""
    dirs = set(base.dirs)
    names: dict[str, object] = {path: ("base", path) for path, _ in base.files}
    data: dict[object, bytes] = {("base", path): b for path, b in base.files}
    for k, op in enumerate(log[:end]):
        if op.kind not in ENTRY_KINDS or ("entry", k) in lost:
            continue
        if op.kind == "write" and _parent(op.path) in dirs:
            names[op.path] = k
            data[k] = b"" if ("data", k) in lost else op.data
        elif op.kind in ("rename", "link") and op.path in names and _parent(op.dst) in dirs:
            if op.kind == "rename":
                names[op.dst] = names.pop(op.path)
            elif op.dst not in names:
                names[op.dst] = names[op.path]
        elif op.kind == "unlink":
            names.pop(op.path, None)
        elif op.kind == "mkdir" and _parent(op.path) in dirs:
            dirs.add(op.path)
        elif op.kind == "rmdir":
            below = op.path + "/"
            dirs = {d for d in dirs if d != op.path and not d.startswith(below)}
            names = {n: i for n, i in names.items() if not n.startswith(below)}
    return Disk(frozenset(dirs), tuple(sorted((n, data[i]) for n, i in names.items())))


def lost_subsets(events: Sequence[Event], *, exhaustive_up_to: int, sample: int, seed: int) -> list[frozenset[Event]]:
    """Every subset of `events` when there are few; else none, all, each one alone, all but each one,
    and a seeded sample."""
    if len(events) <= exhaustive_up_to:
        return [frozenset(c) for r in range(len(events) + 1) for c in itertools.combinations(events, r)]
    rng = random.Random(seed)
    every = frozenset(events)
    chosen = [frozenset(), every, *(frozenset([e]) for e in events), *(every - {e} for e in events)]
    chosen += [frozenset(e for e in events if rng.random() < 0.5) for _ in range(sample)]
    return chosen


@dataclass
class Exploration:
    """What an exploration covered and found."""

    crash_points: int = 0
    combinations: int = 0  # (crash point, lost subset) pairs replayed
    states: int = 0  # distinct disk states materialised and checked
    most_pending: int = 0  # the most operations pending at one crash point
    sampled_points: int = 0  # crash points with too many pending operations for every subset
    failing_states: int = 0
    failures: list[str] = field(default_factory=list)  # the first few, described

    def summary(self) -> str:
        """One line for a report."""
        return (
            f"{self.crash_points} crash points, {self.combinations} (point, lost subset) combinations, "
            f"{self.states} distinct states checked, <= {self.most_pending} pending ops "
            f"({self.sampled_points} points sampled), {self.failing_states} failing"
        )


def _describe(log: Sequence[Op], end: int, lost: frozenset[Event]) -> str:
    gone = ", ".join(f"{kind} of {log[k].kind} {log[k].path}" for kind, k in sorted(lost, key=lambda e: e[1]))
    return f"crash after op {end}/{len(log)}, lost [{gone}]"


# keyword-only knobs of the exploration
def explore(  # noqa: PLR0913
    base: Disk,
    log: Sequence[Op],
    check: Callable[[Path, int], list[str]],
    workdir: Path,
    *,
    phase: Callable[[int], Hashable] = lambda _: None,
    exhaustive_up_to: int = 10,
    sample: int = 48,
    seed: int = 0,
    keep_failures: int = 5,
    stop_after: int | None = None,
) -> Exploration:
    """Check every state a crash during `log` may leave: `check(directory, crash point)` returns what is
    wrong with it. States are checked once per `phase(crash point)` (what the check expects there).
    `stop_after`: stop once that many states failed."""
    found = Exploration()
    seen: set[tuple[Disk, Hashable]] = set()
    for end in range(len(log) + 1):
        events = pending(log, end)
        found.crash_points += 1
        found.most_pending = max(found.most_pending, len(events))
        found.sampled_points += len(events) > exhaustive_up_to
        for lost in lost_subsets(events, exhaustive_up_to=exhaustive_up_to, sample=sample, seed=seed + end):
            if stop_after is not None and found.failing_states >= stop_after:
                return found
            found.combinations += 1
            disk = replay(base, log, end, lost)
            if (disk, phase(end)) in seen:
                continue
            seen.add((disk, phase(end)))
            problems = _checked(disk, check, end, workdir / f"state-{found.states}")
            found.states += 1
            if problems:
                found.failing_states += 1
                if len(found.failures) < keep_failures:
                    found.failures.append(f"{_describe(log, end, lost)}: {problems}")
    return found


def _checked(disk: Disk, check: Callable[[Path, int], list[str]], end: int, where: Path) -> list[str]:
    materialise(disk, where)
    try:
        return check(where, end)
    finally:
        shutil.rmtree(where, ignore_errors=True)
