"""How much a store holds and has room for: the codec's ratio measured on a target's own stored
layers (kept once measured on enough of them), the bytes stored per namespace and layer (scanned in
the background, for `/metrics`), and the free space under a local store (object storage reports none)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

from cache_server.store.blobs import Blobs, LocalBlobs
from cache_server.store.errors import StoreError
from cache_server.store.hidden_store import HiddenStore
from schemas.dtypes import DTYPE_BYTES
from schemas.plan import DOCUMENTED_RATIOS
from schemas.storage import bytes_per_token


def free_bytes(store: HiddenStore) -> int | None:
    """Free bytes of the file system a local store is on; None for object storage."""
    if not isinstance(store.blobs, LocalBlobs):
        return None
    return local_free_bytes(store.blobs.root)


def local_free_bytes(path: Path) -> int:
    """Free bytes of the file system `path` is (or would be created) on."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def measured_ratio(store: HiddenStore, sample: int = 16) -> tuple[float, int] | None:
    """Uncompressed bytes over stored bytes of every layer of up to `sample` published prompts, and
    how many prompts that was; None while none is published."""
    prompts = f"{store.namespace}/prompts"
    raw = stored = counted = 0
    for prompt_id in store.blobs.children(prompts):
        if counted == sample:
            break
        try:
            m = store.manifest(prompt_id)
        except StoreError:
            continue  # a corrupt manifest is reported where it is read
        if m is None or not m.layers:
            continue
        base = f"{prompts}/{prompt_id}/"
        published = {f"{kind}/{k}" for k in m.layers for kind in ("layers", "scales")}
        # One listing of the prompt, counting the published layers and their scales (an unpublished write
        # may lie beside them).
        stored += sum(o.size for o in store.blobs.objects(base) if _array_of(o.key[len(base) :]) in published)
        raw += m.num_tokens * bytes_per_token(m.storage, m.hidden_size, DTYPE_BYTES[m.dtype]) * len(m.layers)
        counted += 1
    return (raw / stored, counted) if stored else None


class CodecRatio:
    """A store's codec ratio for planning: measured on up to `sample` of its prompts and kept once that
    many were measured (more would not move it), the documented figure while none is stored."""

    def __init__(self, store: HiddenStore, sample: int = 16) -> None:
        self._store, self._sample = store, sample
        self._kept: tuple[float, str] | None = None

    def get(self) -> tuple[float, str]:
        """(ratio, where it came from)."""
        if self._kept is not None:
            return self._kept
        measured = measured_ratio(self._store, self._sample)
        if measured is None:
            return DOCUMENTED_RATIOS[self._store.storage]
        found = measured[0], f"measured on {measured[1]} stored prompts of this target"
        if measured[1] == self._sample:
            self._kept = found
        return found


def _array_of(key: str) -> str:
    """`layers/3` for `layers/3/c/0/0` (a key relative to its prompt)."""
    return "/".join(key.split("/")[:2])


def stored_bytes(blobs: Blobs) -> Counter[tuple[str, str]]:
    """Bytes of every object under each namespace of a store, by (namespace, layer): a layer's arrays
    (and an FP8 store's scales) under its id, anything else (token ids, manifests, group metadata)
    under `none`. Objects not published yet, or pruned and awaiting deletion, count: they take room."""
    found: Counter[tuple[str, str]] = Counter()
    for namespace in blobs.children(""):
        base = f"{namespace}/prompts/"
        for o in blobs.objects(namespace):
            parts = o.key[len(base) :].split("/") if o.key.startswith(base) else []
            layer = parts[2] if len(parts) > 3 and parts[1] in ("layers", "scales") else "none"
            found[namespace, layer] += o.size
    return found


class StoredBytesScan:
    """`stored_bytes` of a store, scanned on a background thread at most every `refresh_s`: a scrape
    gets the last scan at once and starts the next one once that is older (listing a large S3 store
    takes a while)."""

    def __init__(self, blobs: Blobs, refresh_s: float) -> None:
        self._blobs, self._refresh_s = blobs, refresh_s
        self._guard = threading.Lock()
        self._last: Counter[tuple[str, str]] | None = None
        self._started = float("-inf")
        self._running = False

    def latest(self) -> Counter[tuple[str, str]] | None:
        """The last finished scan (None before the first), starting another when it is due."""
        with self._guard:
            due = not self._running and time.monotonic() - self._started >= self._refresh_s
            if due:
                self._running, self._started = True, time.monotonic()
            last = self._last
        if due:
            threading.Thread(target=self._scan, name="stored-bytes", daemon=True).start()
        return last

    def _scan(self) -> None:
        try:
            found = stored_bytes(self._blobs)
        except Exception:
            logging.getLogger(__name__).exception("scanning the store's bytes failed")
            found = None
        with self._guard:
            self._running = False
            if found is not None:
                self._last = found
