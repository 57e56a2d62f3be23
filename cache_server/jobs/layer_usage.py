"""Which layers the jobs read: the layer sets of the done ones (`GET /layers/usage`), and the jobs a
store keeping only some layers would take layers from (`cache-server prune` refuses those)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, or_, select

from cache_server.coordination.tables import JOBS
from cache_server.jobs.queue import JobStore
from schemas.layers import format_layer_list
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


@dataclass(frozen=True)
class JobReads:
    """A job whose layers a store must keep, and which they are: None for a queued or running job
    whose checkpoint no done job has evaluated yet (known once a worker has loaded it)."""

    job_id: str
    checkpoint: str  # as submitted, relative to the checkpoint root
    status: str
    layers: tuple[int, ...] | None

    def left_out(self, keep: Collection[int]) -> list[int]:
        """Its layers outside `keep` (none when they are not known)."""
        return [k for k in self.layers or () if k not in keep]


def jobs_reading(jobs: JobStore, fingerprint: str, *, since: float) -> list[JobReads]:
    """The jobs of the target `fingerprint` (or of none recorded) that read its layers, in submission
    order: those queued or running, each with the layers its checkpoint's last done evaluation read,
    and those done at `since` or later (what `GET /layers/usage` counts). Failed jobs read nothing."""
    wanted = or_(JOBS.c.status.in_(("queued", "running")), and_(JOBS.c.status == "done", JOBS.c.finished_at >= since))
    of_target = or_(JOBS.c.target_fingerprint == fingerprint, JOBS.c.target_fingerprint.is_(None))
    columns = (JOBS.c.job_id, JOBS.c.status, JOBS.c.checkpoint, JOBS.c.checkpoint_relative, JOBS.c.report)
    with jobs.db.read() as c:
        rows = c.execute(select(*columns).where(wanted, of_target).order_by(JOBS.c.seq)).all()
    read = {r.checkpoint: tuple(json.loads(r.report)["target_layer_ids"]) for r in rows if r.status == "done"}
    return [JobReads(r.job_id, r.checkpoint_relative, r.status, read.get(r.checkpoint)) for r in rows]


def keep_problem(readers: Sequence[JobReads], keep: Collection[int], *, shown: int = 5) -> str | None:
    """Why keeping only `keep` would drop layers that `readers` read (naming the jobs, their checkpoints
    and the layers), or None when it drops none of theirs."""
    dropping = [(r, r.left_out(keep)) for r in readers if r.layers is None or r.left_out(keep)]
    if not dropping:
        return None
    lines = [
        f"  {r.checkpoint} (job {r.job_id}, {r.status}): "
        + (f"layers {left}" if r.layers is not None else "layers not known until a worker loads it")
        for r, left in dropping[:shown]
    ]
    if len(dropping) > shown:
        lines.append(f"  and {len(dropping) - shown} more jobs")
    needed = sorted({*keep, *(k for r in readers for k in r.layers or ())})
    head = f"--keep-layers {format_layer_list(sorted(keep))} leaves out layers that jobs read (GET /layers/usage):"
    tail = (
        f"nothing was pruned: keep theirs too (--keep-layers {format_layer_list(needed)}), or pass --force to "
        "drop them anyway (a job that asks for them again has them captured again)"
    )
    return "\n".join([head, *lines, tail])
