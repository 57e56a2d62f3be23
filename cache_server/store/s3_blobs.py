"""A store in an S3-compatible bucket (AWS S3, GCS in S3 mode, MinIO, Ceph) through obstore, the
object-store client zarr's own `ObjectStore` is built on.

Settings come from the standard AWS environment variables, read by obstore: `AWS_ENDPOINT_URL` (an
S3-compatible endpoint; plain http only with `AWS_ALLOW_HTTP=true`), `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_REGION` / `AWS_DEFAULT_REGION`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from cache_server.store.blobs import ObjectInfo, Opened

_HEAD_BYTES = 64 << 10  # fetched with an object's size: a Blosc header and its block table fit in it


class _S3Opened:
    """Ranged GETs; the first fetches the object's size with its first 64 KiB, which later reads of
    that span (a chunk's header and block table) are served from."""

    def __init__(self, store: Any, key: str) -> None:
        import obstore

        self._store, self._key = store, key
        try:
            with _s3_errors(key):
                first = obstore.get(store, key, options={"range": (0, _HEAD_BYTES)})
        except FileNotFoundError:
            raise
        except OSError:
            with _s3_errors(key):  # an empty object has no range to ask for (416)
                if int(obstore.head(store, key)["size"]) != 0:
                    raise
            self.size, self._head = 0, memoryview(b"")
            return
        self.size = int(first.meta["size"])
        self._head = memoryview(first.bytes())

    def read_at(self, into: memoryview, offset: int) -> None:
        import obstore

        end = offset + len(into)
        if end > self.size:
            raise ValueError(f"object ends at {self.size} bytes")
        if end <= len(self._head):
            into[:] = self._head[offset:end]
            return
        with _s3_errors(self._key):
            got = obstore.get_range(self._store, self._key, start=offset, end=end)
        into[:] = memoryview(got)

    def close(self) -> None:
        self._head = memoryview(b"")


@contextmanager
def _s3_errors(key: str) -> Iterator[None]:
    """obstore's errors as the store's: NotFound -> FileNotFoundError, AlreadyExists ->
    FileExistsError, the rest -> OSError."""
    from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError

    try:
        yield
    except AlreadyExistsError as e:
        raise FileExistsError(f"object {key!r} exists") from e
    except NotFoundError as e:
        raise FileNotFoundError(f"no object {key!r}") from e
    except BaseError as e:
        raise OSError(f"object store error on {key!r}: {e}") from e


class S3Blobs:
    """Objects under `s3://bucket/prefix`, through obstore (the store class zarr's `ObjectStore` uses)."""

    def __init__(self, url: str) -> None:
        from obstore.store import from_url

        self.location = url.rstrip("/")
        self._store = from_url(self.location)

    def open(self, key: str) -> Opened:
        """Ranged GETs."""
        return _S3Opened(self._store, key)

    def get(self, key: str) -> bytes | None:
        """One GET."""
        import obstore

        try:
            with _s3_errors(key):
                return obstore.get(self._store, key).bytes().to_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """One PUT (S3 replaces an object atomically); `create` sends `If-None-Match: *`."""
        import obstore

        with _s3_errors(key):
            obstore.put(self._store, key, data, use_multipart=False, mode="create" if create else "overwrite")

    def delete(self, prefix: str) -> None:
        """A listing, then batched DELETEs."""
        import obstore

        keys = [prefix, *(o.key for o in self.objects(prefix))]  # the key itself, or what is under it
        with _s3_errors(prefix):
            for start in range(0, len(keys), 1000):  # the S3 batch-delete limit
                obstore.delete(self._store, keys[start : start + 1000])

    def children(self, prefix: str) -> list[str]:
        """The listing's common prefixes."""
        import obstore

        with _s3_errors(prefix):
            found = obstore.list_with_delimiter(self._store, _dir(prefix))
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])

    def exists(self, key: str) -> bool:
        """One HEAD."""
        import obstore

        try:
            with _s3_errors(key):
                obstore.head(self._store, key)
        except FileNotFoundError:
            return False
        return True

    def objects(self, prefix: str, *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """A listing."""
        import obstore

        with _s3_errors(prefix):
            if recursive:
                found: Sequence[Any] = [o for batch in obstore.list(self._store, _dir(prefix)) for o in batch]
            else:
                found = obstore.list_with_delimiter(self._store, _dir(prefix))["objects"]
        for o in found:
            yield ObjectInfo(o["path"], int(o["size"]), o["last_modified"])

    def zarr_store(self, prefix: str, *, read_only: bool = True) -> Any:
        """zarr's ObjectStore over obstore."""
        from obstore.store import from_url
        from zarr.storage import ObjectStore

        return ObjectStore(from_url(f"{self.location}/{prefix}"), read_only=read_only)


def _dir(prefix: str) -> str | None:
    """A listing's prefix for the "directory" `prefix` (None: the whole store)."""
    return prefix.rstrip("/") + "/" if prefix.strip("/") else None
