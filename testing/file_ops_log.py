"""File-system operations performed on a real directory and logged in order, with the bytes written, so
that `crash_states.py` can rebuild what a power loss at any point may have left; and deliberately
broken variants of the local store's protocol, which the explorer must catch."""

from __future__ import annotations

import os
import threading
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from cache_server.store.blobs import LocalBlobs
from cache_server.store.durable import OS, FileOps, OsFileOps, replace_file

# What an `Op` does: kinds that change a directory's entries, then the rest.
ENTRY_KINDS = frozenset({"write", "rename", "link", "unlink", "mkdir", "rmdir"})
KINDS = ENTRY_KINDS | {"fsync", "fsync_dir"}


@dataclass(frozen=True)
class Op:
    """One operation, paths relative to the recorded root: `write` (path, data), `fsync` (path),
    `rename`/`link` (path -> dst), `unlink`, `mkdir`, `rmdir`, `fsync_dir` (path)."""

    kind: str
    path: str
    dst: str = ""
    data: bytes = b""


class RecordingOps:
    """Performs each operation under `root` with the OS's calls and appends it to `log` once it
    succeeded (an operation that raised changed nothing). A tree removal is logged as the unlinks
    and rmdirs it is made of, deepest first."""

    def __init__(self, root: Path, inner: FileOps = OS) -> None:
        self.root = Path(root)
        self.log: list[Op] = []
        self._inner = inner
        self._lock = threading.Lock()  # the log's order is the order the operations took effect

    def _rel(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        """Written, then (with `sync`) an `fsync` logged after it."""
        with self._lock:
            self._inner.write(path, data, sync=sync)
            self.log.append(Op("write", self._rel(path), data=bytes(data)))
            if sync:
                self.log.append(Op("fsync", self._rel(path)))

    def rename(self, src: Path, dst: Path) -> None:
        """Logged as `rename`."""
        with self._lock:
            self._inner.rename(src, dst)
            self.log.append(Op("rename", self._rel(src), self._rel(dst)))

    def link(self, src: Path, dst: Path) -> None:
        """Logged as `link`."""
        with self._lock:
            self._inner.link(src, dst)
            self.log.append(Op("link", self._rel(src), self._rel(dst)))

    def unlink(self, path: Path) -> None:
        """Logged as `unlink`."""
        with self._lock:
            self._inner.unlink(path)
            self.log.append(Op("unlink", self._rel(path)))

    def mkdir(self, path: Path) -> None:
        """Logged as `mkdir`."""
        with self._lock:
            self._inner.mkdir(path)
            self.log.append(Op("mkdir", self._rel(path)))

    def fsync_dir(self, path: Path) -> None:
        """Logged as `fsync_dir`."""
        with self._lock:
            self._inner.fsync_dir(path)
            self.log.append(Op("fsync_dir", self._rel(path)))

    def rmtree(self, path: Path) -> None:
        """Each file unlinked and each directory removed, deepest first, one logged op each."""
        with self._lock:
            if not Path(path).is_dir():
                return
            for dirpath, dirs, files in os.walk(path, topdown=False):
                for name in files:
                    os.unlink(Path(dirpath, name))
                    self.log.append(Op("unlink", self._rel(Path(dirpath, name))))
                for name in dirs:
                    os.rmdir(Path(dirpath, name))
                    self.log.append(Op("rmdir", self._rel(Path(dirpath, name))))
            os.rmdir(path)
            self.log.append(Op("rmdir", self._rel(path)))


class UnsyncedOps:
    """A broken file system layer for the store: object data is never fsynced (writes pass
    `sync=False`), as a store that renames unsynced files into place would be."""

    def __init__(self, inner: FileOps) -> None:
        self._inner = inner

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        """Written, never fsynced."""
        self._inner.write(path, data, sync=False)

    def rename(self, src: Path, dst: Path) -> None:
        """Passed on."""
        self._inner.rename(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        """Passed on."""
        self._inner.link(src, dst)

    def unlink(self, path: Path) -> None:
        """Passed on."""
        self._inner.unlink(path)

    def mkdir(self, path: Path) -> None:
        """Passed on."""
        self._inner.mkdir(path)

    def fsync_dir(self, path: Path) -> None:
        """Passed on."""
        self._inner.fsync_dir(path)

    def rmtree(self, path: Path) -> None:
        """Passed on."""
        self._inner.rmtree(path)


class NoSyncOps(OsFileOps):
    """The OS's calls without any fsync: for checking states that no crash will touch again."""

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        """Written, not fsynced."""
        super().write(path, data, sync=False)

    def fsync_dir(self, path: Path) -> None:
        """Nothing."""


class UnsyncedDirsBlobs(LocalBlobs):
    """The local store as it was before new directories were fsynced into their parents
    (`mkdir(parents=True)` alone), for the explorer to show what that loses."""

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Directories made without an fsync of their parents, then the usual durable replace."""
        path = self.root / key
        missing = [d for d in [path.parent, *path.parent.parents] if not d.is_dir()]
        for d in reversed(missing):
            with suppress(FileExistsError):  # another writer's, as with exist_ok=True
                self.ops.mkdir(d)
        replace_file(path, data, exclusive=create, ops=self.ops)
