"""What interrupted writes leave in a store namespace, and its removal once it is old enough.

Several servers may share a store, so an object that no manifest lists may be a live writer's work in
progress: only what has not changed for `grace_s` is an orphan. Readers never see either kind.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from cache_server.store.blobs import Blobs
from cache_server.store.hierarchy import migrate
from cache_server.store.manifest import PromptManifest, StoreError

log = logging.getLogger(__name__)


def sweep_orphans(
    blobs: Blobs,
    prompts: str,
    manifest: Callable[[str], PromptManifest | None],
    *,
    grace_s: float,
    stop: threading.Event | None = None,
) -> int:
    """Delete unpublished prompts, layers their manifest does not list and stray temporary files,
    all older than `grace_s`; migrate prompts of an older store to prompt groups. Returns how many
    prefixes or files were removed; `stop` ends it early. Errors are logged, not raised. An infinite
    grace sweeps nothing (a prune's store: what it drops it deletes itself, after its own grace)."""
    if math.isinf(grace_s):
        return 0
    try:
        return _sweep(blobs, prompts, manifest, grace_s, stop or threading.Event())
    except Exception as e:  # the store stays usable; the next start sweeps again
        log.error("orphan sweep of %s stopped: %s", prompts, e, exc_info=e)
        return 0


def _sweep(
    blobs: Blobs, prompts: str, manifest: Callable[[str], PromptManifest | None], grace_s: float, stop: threading.Event
) -> int:
    cutoff = datetime.now(UTC) - timedelta(seconds=grace_s)
    removed = _remove_temporaries(blobs, prompts, cutoff)
    for prompt_id in blobs.children(prompts):
        if stop.is_set():
            break
        base = f"{prompts}/{prompt_id}"
        try:
            m = manifest(prompt_id)
        except StoreError as e:
            log.warning("leaving unreadable prompt %s in place: %s", prompt_id, e)
            continue
        if m is None:
            removed += _remove_if_stale(blobs, base, cutoff)
            continue
        if migrate(blobs, base):
            log.info("migrated prompt %s to a prompt group", prompt_id)
        removed += _remove_temporaries(blobs, base, cutoff)
        listed = {str(k) for k in m.layers}
        for name in blobs.children(f"{base}/layers"):
            if name not in listed:
                removed += _remove_if_stale(blobs, f"{base}/layers/{name}", cutoff)
    return removed


def _remove_if_stale(blobs: Blobs, prefix: str, cutoff: datetime) -> int:
    newest = max((o.modified for o in blobs.objects(prefix)), default=None)
    if newest is not None and newest > cutoff:
        return 0  # possibly a live write on another server
    log.info("removing orphaned %s", prefix)
    blobs.delete(prefix)
    return 1


def _remove_temporaries(blobs: Blobs, prefix: str, cutoff: datetime) -> int:
    """A local write's `<name>.<uuid>.tmp`, left when a process died between writing and renaming."""
    stale = [o.key for o in blobs.objects(prefix, recursive=False) if o.key.endswith(".tmp") and o.modified <= cutoff]
    for key in stale:
        blobs.delete(key)
    return len(stale)
