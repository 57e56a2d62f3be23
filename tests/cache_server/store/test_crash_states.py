"""Crash consistency of the store's write protocol: every disk state a power loss may leave during a
capture, an addition of layers, a prune or an orphan sweep (`testing/crash_states.py`) shows each
prompt as its old version or its new one, bit for bit, or absent (and then captured again); a
broken protocol is caught. On S3, each write of a capture and a prune is faulted in turn."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path

import pytest

from cache_server.store.blobs import Blobs, LocalBlobs
from cache_server.store.durable import FileOps
from cache_server.store.s3_blobs import S3Blobs
from testing.crash_states import Disk, Exploration, explore, pending, replay, scratch, snapshot
from testing.file_ops_log import NoSyncOps, Op, RecordingOps, UnsyncedDirsBlobs, UnsyncedOps
from testing.s3 import fresh_prefix
from testing.s3_faults import explore_faults
from testing.store_check import WORKLOADS, Version, Workload, allowed_after, check_store, open_store

BlobsFactory = Callable[[Path, FileOps], Blobs]


def _record(
    workload: Workload, root: Path, blobs: BlobsFactory
) -> tuple[Disk, list[Op], list[tuple[int, str, Version]]]:
    """The workload run on `root` through recorded operations: the disk before, the log, and where in
    the log each step was acknowledged."""
    with open_store(LocalBlobs(root)) as store:
        workload.setup(store)
    base = snapshot(root)
    ops = RecordingOps(root)
    acks: list[tuple[int, str, Version]] = []
    with open_store(blobs(root, ops)) as store:
        workload.act(store, lambda pid, version: acks.append((len(ops.log), pid, version)))
    return base, ops.log, acks


def _explore(
    workload: Workload, tmp_path: Path, blobs: BlobsFactory = LocalBlobs, stop_after: int | None = None
) -> Exploration:
    base, log, acks = _record(workload, tmp_path / "store", blobs)

    def acked(end: int) -> dict[str, Version]:
        return {pid: version for at, pid, version in acks if at <= end}

    def phase(end: int) -> Hashable:
        return tuple(sorted(acked(end).items()))

    def check(where: Path, end: int) -> list[str]:
        return check_store(LocalBlobs(where, NoSyncOps()), allowed_after(workload, acked(end)))

    with scratch(tmp_path) as states:
        return explore(base, log, check, states, phase=phase, stop_after=stop_after)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_crash_state_reads_as_the_old_or_new_version(workload: Workload, tmp_path: Path) -> None:
    found = _explore(workload, tmp_path)
    print(f"\n{workload.name}: {found.summary()}")
    assert found.failures == []
    assert found.states >= 10 and found.combinations >= found.states


def test_object_data_not_fsynced_before_the_manifest_is_caught(tmp_path: Path) -> None:
    found = _explore(WORKLOADS[1], tmp_path, lambda root, ops: LocalBlobs(root, UnsyncedOps(ops)), stop_after=20)
    print(f"\nunsynced data: {found.summary()}")
    assert found.failing_states > 0
    assert any("StoreCorrupt" in f for f in found.failures), found.failures


def test_directories_not_fsynced_into_their_parents_are_caught(tmp_path: Path) -> None:
    """The protocol before new directories were fsynced: a prompt acknowledged as written vanishes,
    or its manifest survives a layer directory that did not."""
    found = _explore(WORKLOADS[1], tmp_path, UnsyncedDirsBlobs)
    print(f"\nunsynced directories: {found.summary()}")
    assert found.failing_states > 0
    assert any("StoreCorrupt" in f or "absent" in f for f in found.failures), found.failures


def test_the_persistence_model(tmp_path: Path) -> None:
    """Unsynced data empties a renamed file; an entry lives only once its directory is fsynced; what
    sits in a lost directory is lost with it."""
    (tmp_path / "r").mkdir()
    base = snapshot(tmp_path / "r")
    log = [
        Op("mkdir", "d"),
        Op("write", "d/f.tmp", data=b"x"),
        Op("rename", "d/f.tmp", "d/f"),
        Op("fsync_dir", "d"),
        Op("write", "g", data=b"y"),
        Op("fsync", "g"),
    ]
    assert pending(log, 4) == [("entry", 0), ("data", 1)]  # the rename and the write's entry are fsynced
    assert replay(base, log, 4, frozenset({("data", 1)})).files == (("d/f", b""),)
    assert replay(base, log, 4, frozenset({("entry", 0)})).files == ()
    assert pending(log, 6) == [("entry", 0), ("data", 1), ("entry", 4)]
    assert replay(base, log, 6, frozenset()).files == (("d/f", b"x"), ("g", b"y"))


@pytest.mark.parametrize("workload", [WORKLOADS[0], WORKLOADS[2]], ids=lambda w: w.name)
def test_every_s3_write_faulted_reads_as_the_old_or_new_version(workload: Workload, s3_env: dict[str, str]) -> None:
    found = explore_faults(workload, lambda: S3Blobs(fresh_prefix()))
    print(f"\nS3 {workload.name}: {found.writes} writes, {found.points} fault points")
    assert found.failures == []
    assert found.points == 2 * found.writes > 0


def test_a_write_lost_without_an_error_is_caught_on_s3(s3_env: dict[str, str]) -> None:
    """The S3 check has teeth: a PUT that vanishes while the writer is told it succeeded."""
    found = explore_faults(WORKLOADS[0], lambda: S3Blobs(fresh_prefix()), modes=["swallowed"])
    print(f"\nS3 swallowed writes: {found.points} points, {len(found.failures)} failing")
    assert found.failures and any("StoreCorrupt" in f for f in found.failures), found.failures
