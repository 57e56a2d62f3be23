"""A store this server must not write: a read-only mount, a directory it may not write, or one it was
told to leave alone. `write_refused` probes a local store at start; `ReadOnlyBlobs` serves its reads
and refuses its writes, so that the store opens, and serves what is published, without writing."""

from __future__ import annotations

import errno
import logging
import uuid
from typing import Any

from cache_server.store.blobs import Blobs, LocalBlobs, ReadsOf

log = logging.getLogger(__name__)

_REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM}


def write_refused(blobs: Blobs) -> OSError | None:
    """The error of writing (and deleting) a probe object at a local store's root when that error
    says the store refuses writes (read-only file system, no permission), else None (another error is
    logged). Object storage is not probed: a bucket that may not be written is named with `--read-only`."""
    if not isinstance(blobs, LocalBlobs):
        return None
    probe = f".write-probe-{uuid.uuid4().hex}"
    try:
        blobs.put(probe, b"")
        blobs.delete(probe)
    except OSError as e:
        if e.errno in _REFUSED:
            return e
        # A full disk, say: the store may still be written once there is room, and reads need none.
        log.warning("store %s: a write probe failed (%s); serving it as writable", blobs.location, e)
    return None


class ReadOnlyBlobs(ReadsOf):
    """`blobs` for reading only: a write raises OSError(EROFS) naming `reason`, and a delete does
    nothing (what a start deletes, a staging prefix or orphans, waits for a server that may write)."""

    def __init__(self, blobs: Blobs, reason: str) -> None:
        super().__init__(blobs)
        self.reason = reason

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Refused: OSError(EROFS)."""
        raise OSError(errno.EROFS, f"the store is read-only ({self.reason}); not written", key)

    def delete(self, prefix: str) -> None:
        """Nothing: the store is left as it is."""

    def zarr_store(self, prefix: str, *, read_only: bool = True) -> Any:
        """A zarr store rooted at `prefix`, always read-only."""
        return self.inner.zarr_store(prefix, read_only=True)


def is_read_only(blobs: Blobs) -> bool:
    """Whether `blobs` is a store opened read-only."""
    return isinstance(blobs, ReadOnlyBlobs)
