"""Durable local writes: a file replaced atomically and fsynced, with its directory entry, and new
directories fsynced into their parents; the file-system operations they take behind one small seam
(`FileOps`), which crash tests record (`testing/crash_states.py`)."""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Protocol


class FileOps(Protocol):
    """The file-system operations a local store performs (`OS`: the real ones)."""

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        """Create (or truncate) `path` and write `data`; with `sync`, fsync it before returning."""

    def rename(self, src: Path, dst: Path) -> None:
        """Rename `src` over `dst`, atomically."""

    def link(self, src: Path, dst: Path) -> None:
        """Hard-link `src` as `dst`; FileExistsError if `dst` exists."""

    def unlink(self, path: Path) -> None:
        """Remove a file; FileNotFoundError if there is none."""

    def mkdir(self, path: Path) -> None:
        """Create one directory; FileExistsError if it exists."""

    def fsync_dir(self, path: Path) -> None:
        """Make a directory's entries (new, renamed, removed) durable."""

    def rmtree(self, path: Path) -> None:
        """Remove a directory and everything under it (none is fine)."""


class OsFileOps:
    """The operating system's calls, as the store made them before the seam existed."""

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        """open, write, fsync (one descriptor)."""
        with open(path, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())

    def rename(self, src: Path, dst: Path) -> None:
        """os.replace."""
        os.replace(src, dst)

    def link(self, src: Path, dst: Path) -> None:
        """os.link."""
        os.link(src, dst)

    def unlink(self, path: Path) -> None:
        """os.unlink."""
        os.unlink(path)

    def mkdir(self, path: Path) -> None:
        """os.mkdir."""
        os.mkdir(path)

    def fsync_dir(self, path: Path) -> None:
        """fsync of the directory opened read-only."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rmtree(self, path: Path) -> None:
        """shutil.rmtree, errors ignored (a concurrent delete is fine)."""
        shutil.rmtree(path, ignore_errors=True)


OS = OsFileOps()


def make_dirs(path: Path, ops: FileOps = OS) -> list[Path]:
    """Create `path` and its missing parents, as `mkdir(parents=True, exist_ok=True)` does; returns the
    ones it made, outermost first, to be fsynced into their parents (`fsync_parents`)."""
    if path.is_dir():
        return []
    try:
        ops.mkdir(path)
        return [path]
    except FileExistsError:
        return []  # another writer's: that writer makes it durable
    except FileNotFoundError:
        made = make_dirs(path.parent, ops)
    with suppress(FileExistsError):
        ops.mkdir(path)
        made.append(path)
    return made


def fsync_parents(made: list[Path], ops: FileOps = OS) -> None:
    """Make new directories' entries durable: by POSIX not even an fsync of the directory itself does,
    and a prompt whose `layers/<k>` vanished in a power loss while its manifest survived would list a
    layer that is gone. A directory another writer made at the same moment is durable once that
    writer's call returns (the store publishes a manifest only after all of its prompt's array writes)."""
    for d in made:
        ops.fsync_dir(d.parent)


def replace_file(path: Path, payload: bytes | memoryview, *, exclusive: bool = False, ops: FileOps = OS) -> None:
    """Atomically replace `path`: write aside as `<name>.<uuid>.tmp`, fsync, rename, fsync the dir.
    `exclusive`: create it only if absent (a hard link, which fails if `path` exists: FileExistsError)."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        ops.write(tmp, payload, sync=True)
        (ops.link if exclusive else ops.rename)(tmp, path)
    except BaseException:
        with suppress(OSError):
            ops.unlink(tmp)  # what a full disk let it write, say: never left behind
        raise
    if exclusive:
        ops.unlink(tmp)
    ops.fsync_dir(path.parent)
