"""Which layer sets the done jobs read: what a store that keeps only some layers must keep."""

from __future__ import annotations

from datetime import UTC, datetime

from cache_server.jobs.queue import JobStore
from schemas.plan import LayerSetUsage, LayerUsage


def layer_usage(jobs: JobStore, *, since: float) -> LayerUsage:
    """The layer sets of the jobs done at `since` (seconds since the epoch) or later, most used first."""
    sets: dict[tuple[int, ...], list[float]] = {}
    for layers, finished in jobs.layer_sets_since(since):
        sets.setdefault(layers, []).append(finished)
    ranked = sorted(sets.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return LayerUsage(
        since=datetime.fromtimestamp(since, UTC),
        layer_sets=[
            LayerSetUsage(layers=list(k), jobs=len(t), last_finished_at=datetime.fromtimestamp(max(t), UTC))
            for k, t in ranked
        ],
        layers=sorted({k for layers in sets for k in layers}),
    )
