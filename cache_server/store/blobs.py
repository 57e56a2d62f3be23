"""Where the store's objects live: a local directory or an S3-compatible bucket, behind one small
interface of whole-object writes, ranged reads, listings and deletes.

Both backends give the same guarantees the store is built on: `put` replaces an object atomically
(readers see the old bytes or the new, never a mix) and durably (fsync locally; an acknowledged PUT
on S3), and a missing object is `FileNotFoundError`. Neither has an atomic rename across keys, so a
prompt is published by writing its arrays under their final keys and its manifest last.

The S3 backend is `s3_blobs.py`; `locations.py` opens the backend a location names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cache_server.store.durable import OS, FileOps, fsync_parents, make_dirs, replace_file


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key (relative to the store), size and last modification."""

    key: str
    size: int
    modified: datetime


class Opened(Protocol):
    """An object opened for ranged reads."""

    size: int

    def read_at(self, into: memoryview, offset: int) -> None:
        """Fill `into` with the object's bytes from `offset`; ValueError if the object ends first."""

    def close(self) -> None:
        """Release it."""


class Blobs(Protocol):
    """A store's objects, by `/`-separated key."""

    location: str  # the path or URL, for messages

    def open(self, key: str) -> Opened:
        """The object for ranged reads; FileNotFoundError if there is none."""

    def get(self, key: str) -> bytes | None:
        """The whole object, or None."""

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Create or replace the object, atomically and durably; with `create`, only create it
        (FileExistsError if it exists: of two racing creators, exactly one wins)."""

    def delete(self, prefix: str) -> None:
        """Remove the object `prefix` and every object under `prefix/` (none is fine)."""

    def children(self, prefix: str) -> list[str]:
        """The names of the "directories" right under `prefix/`, sorted."""

    def objects(self, prefix: str, *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """The objects under `prefix/` (only those right under it unless `recursive`)."""

    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    def zarr_store(self, prefix: str, *, read_only: bool = True) -> Any:
        """A zarr store rooted at `prefix`, for reading with (or, in tests, writing through) zarr."""


class ReadsOf:
    """Objects read from another store's (`inner`): the base of a store that changes only how it writes
    (`read_only.ReadOnlyBlobs`; a test's fault layer)."""

    def __init__(self, inner: Blobs) -> None:
        self.inner = inner
        self.location = inner.location

    def open(self, key: str) -> Opened:
        """`inner`'s."""
        return self.inner.open(key)

    def get(self, key: str) -> bytes | None:
        """`inner`'s."""
        return self.inner.get(key)

    def children(self, prefix: str) -> list[str]:
        """`inner`'s."""
        return self.inner.children(prefix)

    def objects(self, prefix: str, *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """`inner`'s."""
        return self.inner.objects(prefix, recursive=recursive)

    def exists(self, key: str) -> bool:
        """`inner`'s."""
        return self.inner.exists(key)

    def zarr_store(self, prefix: str, *, read_only: bool = True) -> Any:
        """`inner`'s."""
        return self.inner.zarr_store(prefix, read_only=read_only)


# -- a local directory ----------------------------------------------------------------------------


class _LocalOpened:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def read_at(self, into: memoryview, offset: int) -> None:
        got = 0
        while got < len(into):
            n = os.preadv(self._fd, [into[got:]], offset + got)
            if not n:
                raise ValueError(f"object ends at {offset + got} bytes")
            got += n

    def close(self) -> None:
        os.close(self._fd)


class LocalBlobs:
    """Objects as files under `root`; `put` writes aside, fsyncs and renames. Every change to the
    directory goes through `ops` (`durable.FileOps`: the OS; crash tests pass one that records)."""

    def __init__(self, root: Path, ops: FileOps = OS) -> None:
        self.root = Path(root)
        self.ops = ops
        fsync_parents(make_dirs(self.root, ops), ops)
        self.location = str(self.root)

    def open(self, key: str) -> Opened:
        """The file, for pread."""
        return _LocalOpened(self.root / key)

    def get(self, key: str) -> bytes | None:
        """The file's bytes, or None."""
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Written aside, fsynced and renamed over the file (hard-linked, for `create`)."""
        path = self.root / key
        made = make_dirs(path.parent, self.ops)
        replace_file(path, data, exclusive=create, ops=self.ops)
        # After the file: until it exists, an orphan sweep may take its empty new directories for stale.
        fsync_parents(made, self.ops)

    def delete(self, prefix: str) -> None:
        """The file, or the directory tree. Not fsynced: what a power loss brings back is unpublished,
        an orphan the next sweep removes."""
        path = self.root / prefix
        if path.is_dir():
            self.ops.rmtree(path)
            return
        with suppress(FileNotFoundError):
            self.ops.unlink(path)

    def children(self, prefix: str) -> list[str]:
        """Subdirectories."""
        try:
            return sorted(p.name for p in (self.root / prefix).iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def exists(self, key: str) -> bool:
        """Whether the file exists."""
        return (self.root / key).is_file()

    def objects(self, prefix: str, *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """Files, walked."""
        for dirpath, dirs, files in os.walk(self.root / prefix):
            if not recursive:
                dirs.clear()
            for name in files:
                path = Path(dirpath, name)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue  # replaced or removed while listing
                key = path.relative_to(self.root).as_posix()
                yield ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def zarr_store(self, prefix: str, *, read_only: bool = True) -> Any:
        """zarr's LocalStore."""
        from zarr.storage import LocalStore

        return LocalStore(self.root / prefix, read_only=read_only)
