"""How much a store holds and has room for: the codec's ratio measured on a target's own stored
layers (kept once measured on enough of them), and the free space under a local store (object
storage reports none)."""

from __future__ import annotations

import shutil
from pathlib import Path

from cache_server.store.blobs import LocalBlobs
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import StoreError
from schemas.dtypes import DTYPE_BYTES
from schemas.plan import DOCUMENTED_RATIO, DOCUMENTED_SOURCE


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
        base, published = f"{prompts}/{prompt_id}/layers/", {str(k) for k in m.layers}
        # One listing of the prompt's layers, counting the published ones (an unpublished write may lie beside them).
        stored += sum(o.size for o in store.blobs.objects(base) if o.key[len(base) :].split("/")[0] in published)
        raw += m.num_tokens * m.hidden_size * DTYPE_BYTES[m.dtype] * len(m.layers)
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
            return DOCUMENTED_RATIO, DOCUMENTED_SOURCE
        found = measured[0], f"measured on {measured[1]} stored prompts of this target"
        if measured[1] == self._sample:
            self._kept = found
        return found
