"""The store as a Zarr v3 hierarchy that plain `zarr.open_group(<store>/<fingerprint>)` browses:
the namespace and `prompts/` are groups, each prompt is a group whose attributes hold its manifest,
with its `token_ids` array and a `layers/` group of one array per layer.

The prompt group's `zarr.json` is written last and replaced atomically: it is what readers trust, so
a prompt appears only once complete. Stores written before this layout kept the manifest in
`manifest.json`; they are read as they are and migrated when a store opens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cache_server.store import chunks

GROUP = "zarr.json"
OLD_MANIFEST = "manifest.json"  # the manifest file of stores written before the hierarchy


def group_json(attributes: dict[str, Any] | None = None) -> bytes:
    """The `zarr.json` of a Zarr v3 group."""
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}, indent=1).encode()


def ensure_group(path: Path, attributes: dict[str, Any] | None = None) -> None:
    """Make `path` a group (writing its `zarr.json` unless one is there)."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / GROUP).is_file():
        chunks.replace_file(path / GROUP, group_json(attributes))


def manifest_text(prompt_dir: Path) -> str | None:
    """The published manifest's JSON, from the prompt group's attributes (or an older store's
    `manifest.json`); None if the prompt was never published."""
    try:
        node = json.loads((prompt_dir / GROUP).read_text())
    except FileNotFoundError:
        try:
            return (prompt_dir / OLD_MANIFEST).read_text()
        except FileNotFoundError:
            return None
    except json.JSONDecodeError:
        return "{}"  # unreadable: the manifest check reports it
    manifest = node.get("attributes", {}).get("manifest") if isinstance(node, dict) else None
    return json.dumps(manifest) if manifest is not None else None


def is_published(prompt_dir: Path) -> bool:
    """Whether a prompt directory holds a published prompt (in either layout)."""
    return manifest_text(prompt_dir) is not None


def publish_manifest(prompt_dir: Path, manifest: dict[str, Any]) -> None:
    """Write the prompt group, the last step of publishing: before it, readers see nothing new."""
    ensure_group(prompt_dir / "layers")
    chunks.replace_file(prompt_dir / GROUP, group_json({"manifest": manifest}))
    (prompt_dir / OLD_MANIFEST).unlink(missing_ok=True)


def migrate(prompt_dir: Path) -> bool:
    """Turn an older store's prompt (`manifest.json`) into a prompt group; True if it was one."""
    old = prompt_dir / OLD_MANIFEST
    if (prompt_dir / GROUP).is_file() or not old.is_file():
        return False
    publish_manifest(prompt_dir, json.loads(old.read_text()))
    return True
