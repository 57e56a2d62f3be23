"""A store's location as users write it, to its backend: a local directory (`blobs.LocalBlobs`) or
`s3://bucket/prefix` (`s3_blobs.S3Blobs`, whose client loads only when a store is on S3)."""

from __future__ import annotations

from pathlib import Path

from cache_server.store.blobs import Blobs, LocalBlobs


def open_blobs(location: str) -> Blobs:
    """`s3://bucket/prefix` -> `S3Blobs`; anything else is a local directory."""
    if location.startswith("s3://"):
        from cache_server.store.s3_blobs import S3Blobs

        return S3Blobs(location)
    if "://" in location:
        raise ValueError(f"store {location!r}: only a directory or an s3://bucket/prefix URL is supported")
    return LocalBlobs(Path(location))
