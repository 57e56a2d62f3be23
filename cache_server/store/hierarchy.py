"""The store as a Zarr v3 hierarchy that plain `zarr.open_group(<store>/<fingerprint>)` browses:
the namespace and `prompts/` are groups, each prompt is a group whose attributes hold its manifest,
with its `token_ids` array and a `layers/` group of one array per layer.

The prompt group's `zarr.json` is written last and replaced atomically: it is what readers trust, so
a prompt appears only once complete. Stores written before this layout kept the manifest in
`manifest.json`; they are read as they are and migrated when a store opens.
"""

from __future__ import annotations

import json
from typing import Any

from cache_server.store.blobs import Blobs
from cache_server.store.chunks import ZARR_JSON
from cache_server.store.errors import StoreError

OLD_MANIFEST = "manifest.json"  # the manifest object of stores written before the hierarchy


def group_json(attributes: dict[str, Any] | None = None) -> bytes:
    """The `zarr.json` of a Zarr v3 group."""
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}, indent=1).encode()


def ensure_group(blobs: Blobs, prefix: str, attributes: dict[str, Any] | None = None) -> None:
    """Make `prefix` a group (writing its `zarr.json` unless one is there)."""
    if blobs.get(f"{prefix}/{ZARR_JSON}") is None:
        blobs.put(f"{prefix}/{ZARR_JSON}", group_json(attributes))


def manifest_text(blobs: Blobs, prompt: str) -> str | None:
    """The published manifest's JSON, from the prompt group's attributes (or an older store's
    `manifest.json`); None if the prompt was never published."""
    raw = blobs.get(f"{prompt}/{ZARR_JSON}")
    if raw is None:
        old = blobs.get(f"{prompt}/{OLD_MANIFEST}")
        return None if old is None else old.decode()
    try:
        node = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "{}"  # unreadable: the manifest check reports it
    manifest = node.get("attributes", {}).get("manifest") if isinstance(node, dict) else None
    return json.dumps(manifest) if manifest is not None else None


def publish_manifest(blobs: Blobs, prompt: str, manifest: dict[str, Any], *, new: bool = False) -> None:
    """Write the prompt group, the last step of publishing: before it, readers see nothing new.
    A `new` prompt's is only created: StoreError if another writer published it first (theirs stands)."""
    if new:  # a prompt published before has its layers group
        blobs.put(f"{prompt}/layers/{ZARR_JSON}", group_json())
    try:
        blobs.put(f"{prompt}/{ZARR_JSON}", group_json({"manifest": manifest}), create=new)
    except FileExistsError as e:
        raise StoreError(f"{prompt} was published by another writer meanwhile") from e


def migrate(blobs: Blobs, prompt: str) -> bool:
    """Turn an older store's prompt (`manifest.json`) into a prompt group; True if it was one."""
    old = blobs.get(f"{prompt}/{OLD_MANIFEST}")
    if old is None or blobs.get(f"{prompt}/{ZARR_JSON}") is not None:
        return False
    ensure_group(blobs, f"{prompt}/layers")
    publish_manifest(blobs, prompt, json.loads(old))
    blobs.delete(f"{prompt}/{OLD_MANIFEST}")
    return True
