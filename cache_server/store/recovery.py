"""What interrupted writes leave in a store namespace, and its removal once it is old enough.

Several servers may share a store, so an object that no manifest lists may be a live writer's work in
progress: only what has not changed for `grace_s` is an orphan. Readers never see either kind. What a
running prune has scheduled for deletion (`prune_record.py`) is the prune's to delete, not an orphan.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from cache_server.store import prune_record
from cache_server.store.blobs import Blobs, LocalBlobs
from cache_server.store.chunks import ZARR_JSON
from cache_server.store.errors import StoreError
from cache_server.store.hierarchy import migrate
from cache_server.store.manifest import PromptManifest

log = logging.getLogger(__name__)


class Manifests(Protocol):
    """A store's manifest reader (`HiddenStore.manifest`)."""

    def __call__(self, prompt_id: str, *, fresh: bool = ...) -> PromptManifest | None:
        """The published manifest, or None; `fresh` reads it again."""


def sweep_orphans(
    blobs: Blobs,
    prompts: str,
    manifest: Manifests,
    *,
    grace_s: float,
    stop: threading.Event | None = None,
) -> int:
    """Delete unpublished prompts, arrays (layers, an FP8 store's scales) their manifest does not list,
    stray temporary files and the records of prunes that died, all older than `grace_s`; migrate
    prompts of an older store to prompt groups. Returns how many prefixes or files were removed; `stop`
    ends it early. Errors are logged, not raised. An infinite grace sweeps nothing (a prune's store:
    what it drops it deletes itself, after its own grace)."""
    if math.isinf(grace_s):
        return 0
    try:
        return _sweep(blobs, prompts, manifest, grace_s, stop or threading.Event())
    except Exception as e:  # the store stays usable; the next start sweeps again
        log.error("orphan sweep of %s stopped: %s", prompts, e, exc_info=e)
        return 0


def _sweep(blobs: Blobs, prompts: str, manifest: Manifests, grace_s: float, stop: threading.Event) -> int:
    cutoff = datetime.now(UTC) - timedelta(seconds=grace_s)
    namespace = prompts.rpartition("/")[0]
    # Only a local store's writes leave temporary files (`durable.replace_file`): S3 is not listed for them.
    temporaries = isinstance(blobs, LocalBlobs)
    removed = _sweep_records(blobs, namespace, grace_s, cutoff, temporaries)
    for level in (namespace, prompts) if temporaries else ():
        removed += _remove_temporaries(blobs, level, cutoff)
    kinds = _array_kinds(blobs, namespace)
    for prompt_id in blobs.children(prompts):
        if stop.is_set():
            break
        base = f"{prompts}/{prompt_id}"
        try:
            m = manifest(prompt_id, fresh=True)  # a copy cached earlier may miss a layer captured since
        except StoreError as e:
            log.warning("leaving unreadable prompt %s in place: %s", prompt_id, e)
            continue
        if m is None:
            removed += _remove_if_stale(blobs, base, cutoff)
            continue
        if migrate(blobs, base):
            log.info("migrated prompt %s to a prompt group", prompt_id)
        for level in ("", *kinds) if temporaries else ():  # `layers/` holds its group's zarr.json
            removed += _remove_temporaries(blobs, f"{base}/{level}".rstrip("/"), cutoff)
        removed += _sweep_arrays(blobs, namespace, base, m, kinds, cutoff)
    return removed


def _sweep_arrays(
    blobs: Blobs, namespace: str, base: str, m: PromptManifest, kinds: tuple[str, ...], cutoff: datetime
) -> int:
    """The arrays of a published prompt that its manifest does not list, unless a prune will delete them."""
    listed = {str(k) for k in m.layers}
    unlisted = [(kind, name) for kind in kinds for name in blobs.children(f"{base}/{kind}") if name not in listed]
    if not unlisted:
        return 0
    # Read after the manifest: a prune records what it drops before it publishes the manifest without it.
    pruning = prune_record.scheduled(blobs, namespace)
    removed = 0
    for kind, name in unlisted:
        if not any(s.covers(m.prompt_id, name) for s in pruning):
            removed += _remove_if_stale(blobs, f"{base}/{kind}/{name}", cutoff)
    return removed


def _sweep_records(blobs: Blobs, namespace: str, grace_s: float, cutoff: datetime, temporaries: bool) -> int:
    """Remove the records of prunes that died (their promise long past) and whatever else lies there."""
    records = f"{namespace}/{prune_record.PRUNES}"
    removed = _remove_temporaries(blobs, records, cutoff) if temporaries else 0
    readable = {s.key: s for s in prune_record.scheduled(blobs, namespace)}
    for run in blobs.children(records):
        key = f"{records}/{run}"
        found = readable.get(key)
        if found is None:
            removed += _remove_if_stale(blobs, key, cutoff)
        elif found.delete_at + grace_s < time.time():
            log.info("removing the record of a prune that stopped before deleting what it dropped: %s", key)
            blobs.delete(key)
            removed += 1
        elif temporaries:
            removed += _remove_temporaries(blobs, key, cutoff)
    return removed


def _array_kinds(blobs: Blobs, namespace: str) -> tuple[str, ...]:
    """`layers`, and `scales` in an FP8 store (its namespace's identity says which)."""
    raw = blobs.get(f"{namespace}/{ZARR_JSON}")
    try:
        storage = json.loads(raw)["attributes"]["hidden_state_cache"].get("storage", "exact") if raw else "exact"
    except (ValueError, KeyError, TypeError, AttributeError):
        storage = "exact"
    return ("layers",) if storage == "exact" else ("layers", "scales")


def _remove_if_stale(blobs: Blobs, prefix: str, cutoff: datetime) -> int:
    newest = max((o.modified for o in blobs.objects(prefix)), default=None)
    # Recent, or not a single file yet (directories a write just made): possibly a live write.
    if newest is None or newest > cutoff:
        return 0
    log.info("removing orphaned %s", prefix)
    blobs.delete(prefix)
    return 1


def _remove_temporaries(blobs: Blobs, prefix: str, cutoff: datetime) -> int:
    """A local write's `<name>.<uuid>.tmp`, left when a process died between writing and renaming."""
    stale = [o.key for o in blobs.objects(prefix, recursive=False) if o.key.endswith(".tmp") and o.modified <= cutoff]
    for key in stale:
        blobs.delete(key)
    return len(stale)
