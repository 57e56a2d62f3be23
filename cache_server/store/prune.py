"""`cache-server prune`: drop stored layers outside a set, without ever showing a reader half a prompt.

Per prompt, the only write is its manifest, published again without the dropped layers (atomic: a
reader sees the old manifest or the new one). The dropped layers' files are deleted only after
`grace_s`, so that a server which read the old manifest just before finishes its reads; one that
still holds the old manifest afterwards finds the files gone, reads the manifest afresh and captures
the layer again (`StoredRows`), exactly as a layer never stored. A layer captured again in the
meantime is listed by the fresh manifest read just before deleting, and kept.

Both writes of a prompt happen under its capture lease (`Leases`: the coordination database's, which
servers capture under), so that a capture adding layers to the prompt never interleaves with them; a
prompt being captured is tried again after the others. What the prune will delete is recorded in the
store first (`prune_record.py`), so that the orphan sweep of a server starting meanwhile leaves it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from cache_server.store.blobs import Blobs
from cache_server.store.chunks import ZARR_JSON
from cache_server.store.errors import StoreInputError
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.prune_record import PruneRecord


@dataclass
class PruneResult:
    """What a prune did: layers dropped per prompt, and the bytes their files took."""

    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)
    prompts_seen: int = 0
    not_stored: list[str] = field(default_factory=list)  # asked for, but not published (yet)
    busy: list[str] = field(default_factory=list)  # captured all along, past the wait: left as they were
    bytes_deleted: int = 0

    def lines(self) -> list[str]:
        """The result for a terminal."""
        layers = sorted({k for ks in self.dropped.values() for k in ks})
        return [
            f"prompts     {self.prompts_seen} published, {len(self.dropped)} pruned",
            f"dropped     layers {layers}" if layers else "dropped     nothing (every prompt holds only kept layers)",
            f"deleted     {self.bytes_deleted} bytes",
        ] + [
            f"{label:<11} {len(ids)} prompts: {ids[:5]}"
            for label, ids in (("not stored", self.not_stored), ("busy", self.busy))
            if ids
        ]


class Leases(Protocol):
    """Prompts' capture leases (`coordination.holds.PromptHolds`)."""

    def hold(self, prompt_id: str) -> bool:
        """Take the prompt's lease; False while a capture holds it."""

    def release(self, prompt_id: str) -> None:
        """Give it back."""


class NoLeases:
    """No coordination database: every prompt is taken at once (a store no server captures into)."""

    def hold(self, prompt_id: str) -> bool:
        """Always."""
        return True

    def release(self, prompt_id: str) -> None:
        """Nothing to give back."""


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
    leases: Leases | None = None,
    step: Callable[[str, str], None] | None = None,
    busy_wait_s: float = 600.0,
    retry_s: float = 0.5,
) -> PruneResult:
    """Drop every stored layer outside `keep` from `prompt_ids` (default: every published prompt).
    Each prompt is rewritten under `leases` (None: no database); one being captured is tried again every
    `retry_s` for up to `busy_wait_s`, then left as it was (`busy`). `sleep` waits the grace and the
    retries; `step(name, prompt_id)` is called between the steps (`drop:hold`, `drop:read`,
    `drop:published`, `drop:released`, then `delete:...`): a test's hook to interleave other writers."""
    if not keep:
        raise StoreInputError("--keep-layers must name at least one layer")
    prompts = f"{store.namespace}/prompts"
    ids = list(store.blobs.children(prompts) if prompt_ids is None else prompt_ids)
    record = PruneRecord(store.blobs, store.namespace, keep, None if prompt_ids is None else ids, grace_s=grace_s)
    result = PruneResult()
    held = _Held(leases or NoLeases(), step or _no_step, sleep, busy_wait_s, retry_s)

    def drop(pid: str) -> None:
        m = store.manifest(pid, fresh=True)
        held.step("drop:read", pid)
        gone = store.forget_layers(pid, [k for k in m.layers if k not in keep]) if m is not None else ()
        if gone:
            result.dropped[pid] = gone
            held.step("drop:published", pid)
        record.beat(grace_s)

    def delete(pid: str) -> None:
        fresh = store.manifest(pid, fresh=True)
        held.step("delete:read", pid)
        listed = set(fresh.layers) if fresh is not None else set()
        for k in (k for k in result.dropped[pid] if k not in listed):
            for kind in ("layers", "scales"):
                array = f"{prompts}/{pid}/{kind}/{k}"
                result.bytes_deleted += sum(o.size for o in store.blobs.objects(array))
                store.blobs.delete(array)
        held.step("delete:deleted", pid)
        record.beat(0)

    published: list[str] = []
    for pid in ids:  # a prompt not published yet is not held (nor its capture delayed)
        (published if store.manifest(pid, fresh=True) is not None else result.not_stored).append(pid)
    result.prompts_seen = len(published)
    result.busy = held.each("drop", published, drop, lambda: record.beat(grace_s))
    if result.dropped:
        record.promise(grace_s)
        sleep(grace_s)
    result.busy += held.each("delete", list(result.dropped), delete, lambda: record.beat(0))
    record.remove()
    return result


def _no_step(name: str, prompt_id: str) -> None:
    pass


@dataclass
class _Held:
    """Work on prompts, each under its lease; busy ones tried again until the wait runs out."""

    leases: Leases
    step: Callable[[str, str], None]
    sleep: Callable[[float], None]
    busy_wait_s: float
    retry_s: float

    def each(self, phase: str, ids: list[str], work: Callable[[str], None], waiting: Callable[[], None]) -> list[str]:
        """`work(pid)` for each prompt under its lease; the prompts still busy when the wait ran out."""
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            busy = []
            for pid in ids:
                self.step(f"{phase}:hold", pid)
                if not self.leases.hold(pid):
                    busy.append(pid)
                    continue
                try:
                    work(pid)
                finally:
                    self.leases.release(pid)
                    self.step(f"{phase}:released", pid)
            if not busy or time.monotonic() >= deadline:
                return busy
            waiting()
            self.sleep(self.retry_s)
            ids = busy
