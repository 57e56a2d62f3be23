"""What a running `cache-server prune` has scheduled for deletion, recorded in the store before it
republishes any manifest, so that the orphan sweep of a server starting meanwhile leaves those files to
the prune: its own deletion after its grace stays the only one (and it keeps a layer captured again).

A record is the Zarr group `<namespace>/prunes/<run>/`, whose attributes name the kept layers, the
prompts (None: every one) and `delete_at`, which a running prune keeps ahead of the clock by rewriting
the record. One whose `delete_at` has passed by more than the sweep's grace is a dead prune's: the
sweep removes it, and the layers it named are then orphans like any other.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cache_server.store import hierarchy
from cache_server.store.blobs import Blobs
from cache_server.store.chunks import ZARR_JSON

log = logging.getLogger(__name__)

PRUNES = "prunes"  # under a namespace: one group per running prune
HEARTBEAT_S = 60.0  # a running prune's record is rewritten about this often, each time promising as long again


@dataclass(frozen=True)
class Scheduled:
    """One prune's record: the layers outside `keep` of `prompts` (None: of every prompt) are the
    prune's to delete until `delete_at` (epoch seconds)."""

    key: str
    keep: frozenset[int]
    prompts: frozenset[str] | None
    delete_at: float

    def covers(self, prompt_id: str, layer: str) -> bool:
        """Whether the array `layers/<layer>` (or `scales/<layer>`) of `prompt_id` is this prune's."""
        outside = not layer.isdigit() or int(layer) not in self.keep
        return outside and (self.prompts is None or prompt_id in self.prompts)


class PruneRecord:
    """The record of one running prune: written at once, renewed while the prune runs, removed once the
    prune has deleted what it dropped."""

    def __init__(
        self,
        blobs: Blobs,
        namespace: str,
        keep: Iterable[int],
        prompts: Iterable[str] | None,
        *,
        grace_s: float,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._blobs, self._now = blobs, now
        self.key = f"{namespace}/{PRUNES}/{uuid.uuid4().hex}"
        self._body = {"keep": sorted(set(keep)), "prompts": None if prompts is None else sorted(set(prompts))}
        self._written = float("-inf")
        hierarchy.ensure_group(blobs, f"{namespace}/{PRUNES}")
        self.promise(grace_s)

    def promise(self, ahead_s: float) -> None:
        """Rewrite the record: the files stay the prune's for `ahead_s` and one heartbeat more."""
        now = self._now()
        body = {**self._body, "delete_at": now + ahead_s + HEARTBEAT_S}
        self._blobs.put(f"{self.key}/{ZARR_JSON}", hierarchy.group_json({"prune": body}))
        self._written = now

    def beat(self, ahead_s: float) -> None:
        """`promise`, when the last one is half a heartbeat old (a call per prompt costs no write)."""
        if self._now() - self._written >= HEARTBEAT_S / 2:
            self.promise(ahead_s)

    def remove(self) -> None:
        """The prune is done: nothing of it is left to protect."""
        self._blobs.delete(self.key)


def scheduled(blobs: Blobs, namespace: str) -> list[Scheduled]:
    """Every prune record of a namespace, as stored now (an unreadable one is logged and left out)."""
    found = []
    for run in blobs.children(f"{namespace}/{PRUNES}"):
        key = f"{namespace}/{PRUNES}/{run}"
        raw = blobs.get(f"{key}/{ZARR_JSON}")
        if raw is None:
            continue  # being written, or an interrupted write's temporary file: the sweep's to judge
        try:
            body = json.loads(raw)["attributes"]["prune"]
            prompts = body["prompts"]
            found.append(
                Scheduled(
                    key,
                    frozenset(int(k) for k in body["keep"]),
                    None if prompts is None else frozenset(map(str, prompts)),
                    float(body["delete_at"]),
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            log.warning("prune record %s is unreadable: %s", key, e)
    return found
