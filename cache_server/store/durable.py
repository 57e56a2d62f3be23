"""Durable local writes: a file replaced atomically and fsynced, with its directory entry."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, payload: bytes | memoryview, *, exclusive: bool = False) -> None:
    """Atomically replace `path`: write aside as `<name>.<uuid>.tmp`, fsync, rename, fsync the dir.
    `exclusive`: create it only if absent (a hard link, which fails if `path` exists: FileExistsError)."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    if exclusive:
        try:
            os.link(tmp, path)
        finally:
            tmp.unlink()
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)
