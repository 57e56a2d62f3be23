"""`cache-server prune`: drop stored layers outside a set, without ever showing a reader half a prompt.

Per prompt, the only write is its manifest, published again without the dropped layers (atomic: a
reader sees the old manifest or the new one). The dropped layers' files are deleted only after
`grace_s`, so that a server which read the old manifest just before finishes its reads; one that
still holds the old manifest afterwards finds the files gone, reads the manifest afresh and captures
the layer again (`StoredRows`), exactly as a layer never stored. A layer captured again in the
meantime is listed by the fresh manifest read just before deleting, and kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from cache_server.store.blobs import Blobs
from cache_server.store.chunks import ZARR_JSON
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import StoreInputError


@dataclass
class PruneResult:
    """What a prune did: layers dropped per prompt, and the bytes their files took."""

    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)
    prompts_seen: int = 0
    not_stored: list[str] = field(default_factory=list)  # asked for, but not published (yet)
    bytes_deleted: int = 0

    def lines(self) -> list[str]:
        """The result for a terminal."""
        layers = sorted({k for ks in self.dropped.values() for k in ks})
        return [
            f"prompts     {self.prompts_seen} published, {len(self.dropped)} pruned",
            f"dropped     layers {layers}" if layers else "dropped     nothing (every prompt holds only kept layers)",
            f"deleted     {self.bytes_deleted} bytes",
        ] + ([f"not stored  {len(self.not_stored)} prompts: {self.not_stored[:5]}"] if self.not_stored else [])


def namespaces(blobs: Blobs) -> dict[str, dict[str, object]]:
    """Each namespace of a store and its identity (model name, dtype, storage, hidden size)."""
    found = {}
    for name in blobs.children(""):
        raw = blobs.get(f"{name}/{ZARR_JSON}")
        identity = json.loads(raw).get("attributes", {}).get("hidden_state_cache") if raw is not None else None
        if isinstance(identity, dict):
            found[name] = identity
    return found


def open_namespace(blobs: Blobs, namespace: str | None) -> HiddenStore:
    """The store of `namespace` (default: the store's only one); StoreInputError naming the choices."""
    known = namespaces(blobs)
    if namespace is None and len(known) == 1:
        namespace = next(iter(known))
    if namespace not in known:
        choices = ", ".join(f"{n} ({i.get('model_name')}, {i.get('storage', 'exact')})" for n, i in known.items())
        raise StoreInputError(f"name one namespace of {blobs.location} with --namespace: {choices or 'none stored'}")
    identity = known[namespace]
    return HiddenStore(
        blobs,
        fingerprint=namespace,
        model_name=str(identity["model_name"]),
        hidden_size=int(str(identity["hidden_size"])),
        dtype=getattr(torch, str(identity["dtype"])),
        storage=identity.get("storage", "exact"),  # type: ignore[arg-type]  # the store checks it
        orphan_grace_s=float("inf"),  # no sweep: what a prune drops is deleted by the prune, after its grace
    )


def prune(
    store: HiddenStore,
    keep: Sequence[int],
    prompt_ids: Iterable[str] | None = None,
    *,
    grace_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> PruneResult:
    """Drop every stored layer outside `keep` from `prompt_ids` (default: every published prompt)."""
    if not keep:
        raise StoreInputError("--keep-layers must name at least one layer")
    prompts = f"{store.namespace}/prompts"
    result = PruneResult()
    for pid in store.blobs.children(prompts) if prompt_ids is None else prompt_ids:
        m = store.manifest(pid, fresh=True)
        if m is None:
            result.not_stored.append(pid)
            continue
        result.prompts_seen += 1
        gone = store.forget_layers(pid, [k for k in m.layers if k not in keep])
        if gone:
            result.dropped[pid] = gone
    if result.dropped:
        sleep(grace_s)
    for pid, layers in result.dropped.items():
        fresh = store.manifest(pid, fresh=True)
        held = set(fresh.layers) if fresh is not None else set()
        for k in (k for k in layers if k not in held):
            for kind in ("layers", "scales"):
                array = f"{prompts}/{pid}/{kind}/{k}"
                result.bytes_deleted += sum(o.size for o in store.blobs.objects(array))
                store.blobs.delete(array)
    return result
