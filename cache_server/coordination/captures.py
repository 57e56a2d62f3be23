"""Capture work shared by every server on one store: a prompt's missing layers are computed by exactly
one server, which claims them under a lease, renews it while it computes, and marks them done once
they are published. A dead server's lease expires and another server takes the work over.

A request for layers that a running capture does not cover is kept (`more`) and queued when it ends,
so single-flight holds across servers: asking two servers for the same missing layer computes it once.
Each change that queues or finishes work sends a `Notice`, which wakes every server's waiters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, or_, select

from cache_server.coordination.database import Database, max_seq
from cache_server.coordination.notices import Notice
from cache_server.coordination.tables import CAPTURES


@dataclass(frozen=True)
class Claimed:
    """Capture work this server now holds: compute `layers` of `prompt_id`."""

    prompt_id: str
    layers: tuple[int, ...]
    attempts: int


@dataclass(frozen=True)
class CaptureState:
    """Where a prompt's capture stands."""

    status: str  # queued | running | done | failed
    owner: str | None
    error: str | None
    published: bool  # the prompt is ready (some of its layers may still be queued)


class CaptureQueue:
    """The `captures` rows of one namespace, seen by the server instance `owner`."""

    def __init__(
        self,
        db: Database,
        namespace: str,
        owner: str,
        *,
        lease_s: float = 30.0,
        max_attempts: int = 10,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.db, self.namespace, self.owner = db, namespace, owner
        self.lease_s, self.max_attempts, self._now = lease_s, max_attempts, now

    def request_many(
        self, wanted: Mapping[str, Iterable[int]], *, retry_failed: bool = False
    ) -> dict[str, CaptureState]:
        """Ask for the layers of each prompt, in one transaction: queued, unless a queued or running capture
        covers them; a failed prompt stays failed unless `retry_failed` (a re-registration), which asks
        for what failed again as well. Each prompt's state after it (none asked of a prompt without a row)."""
        queued = False
        with self.db.transaction(ordered=True) as c:
            mine = and_(CAPTURES.c.namespace == self.namespace, CAPTURES.c.prompt_id.in_(list(wanted)))
            rows = {r.prompt_id: r for r in c.execute(select(CAPTURES).where(mine).with_for_update())}
            seq = max_seq(c, CAPTURES.c.seq, CAPTURES.c.namespace == self.namespace)
            for prompt_id, asked in wanted.items():
                layers, row = sorted(set(asked)), rows.get(prompt_id)
                if row is not None and row.status == "failed" and retry_failed:
                    # What failed is asked for again too (layers added to a published prompt, say).
                    layers = sorted({*layers, *json.loads(row.layers), *json.loads(row.more)})
                if not layers:
                    continue
                if row is None:
                    seq, queued = seq + 1, True
                    c.execute(
                        CAPTURES.insert().values(
                            namespace=self.namespace,
                            prompt_id=prompt_id,
                            seq=seq,
                            status="queued",
                            layers=json.dumps(layers),
                            more="[]",
                            attempts=0,
                            published=False,
                        )
                    )
                elif row.status == "failed" and not retry_failed:
                    pass
                elif row.status == "running":
                    more = sorted(set(json.loads(row.more)) | (set(layers) - set(json.loads(row.layers))))
                    self._update(c, prompt_id, more=json.dumps(more))
                elif row.status == "queued":
                    self._update(c, prompt_id, layers=json.dumps(sorted(set(json.loads(row.layers)) | set(layers))))
                elif layers:  # done (or a failure retried): a new capture
                    seq, queued = seq + 1, True
                    self._update(
                        c,
                        prompt_id,
                        status="queued",
                        layers=json.dumps(layers),
                        more="[]",
                        error=None,
                        attempts=0,
                        owner=None,
                        lease_expires_at=None,
                        seq=seq,
                    )
            if queued:
                self.db.notices.send(c, Notice("queued", self.namespace))
            return {p: state for p in wanted if (state := self._state(c, p)) is not None}

    def claim(self) -> Claimed | None:
        """The oldest queued capture, or a running one whose lease expired, now held by this server.
        An idle server's poll is a lock-free read; on Postgres, servers claim in parallel (`SKIP LOCKED`)."""
        now = self._now()
        claimable = select(CAPTURES).where(
            CAPTURES.c.namespace == self.namespace,
            or_(
                CAPTURES.c.status == "queued", and_(CAPTURES.c.status == "running", CAPTURES.c.lease_expires_at <= now)
            ),
        )
        if not self.db.any(claimable):
            return None
        with self.db.transaction() as c:
            row = c.execute(claimable.order_by(CAPTURES.c.seq).limit(1).with_for_update(skip_locked=True)).first()
            if row is None:
                return None
            if row.attempts >= self.max_attempts:  # it took down every server that ran it
                error = f"given up after {row.attempts} attempts whose leases expired (last: {row.owner})"
                self._update(c, row.prompt_id, status="failed", error=error, owner=None, lease_expires_at=None)
                self.db.notices.send(c, Notice("finished", self.namespace, row.prompt_id))
                return None
            layers = sorted(set(json.loads(row.layers)) | set(json.loads(row.more)))
            self._update(
                c,
                row.prompt_id,
                status="running",
                owner=self.owner,
                lease_expires_at=now + self.lease_s,
                attempts=row.attempts + 1,
                layers=json.dumps(layers),
                more="[]",
            )
            return Claimed(row.prompt_id, tuple(layers), row.attempts + 1)

    def renew(self, prompt_ids: Iterable[str]) -> None:
        """Extend this server's leases on `prompt_ids`."""
        ids = list(prompt_ids)
        if not ids:
            return
        with self.db.transaction() as c:
            c.execute(
                CAPTURES.update()
                .where(self._mine(), CAPTURES.c.prompt_id.in_(ids))
                .values(lease_expires_at=self._now() + self.lease_s)
            )

    def done(self, prompt_id: str) -> bool:
        """The held capture is published: done, or queued again for what was asked meanwhile.
        False if this server no longer held it (its lease was taken over)."""
        with self.db.transaction() as c:
            row = self._row(c, prompt_id, lock=True)
            if row is None or row.status != "running" or row.owner != self.owner:
                return False
            more = json.loads(row.more)
            self._update(
                c,
                prompt_id,
                status="queued" if more else "done",
                layers=json.dumps(more),
                more="[]",
                owner=None,
                lease_expires_at=None,
                attempts=0,
                published=True,
            )
            self.db.notices.send(c, Notice("finished", self.namespace, prompt_id))
            if more:
                self.db.notices.send(c, Notice("queued", self.namespace))
            return True

    def fail(self, prompt_id: str, error: str) -> None:
        """The target failed on the held capture: failed until the prompt is registered again."""
        with self.db.transaction() as c:
            c.execute(
                CAPTURES.update()
                .where(self._mine(), CAPTURES.c.prompt_id == prompt_id)
                .values(status="failed", error=error, owner=None, lease_expires_at=None)
            )
            self.db.notices.send(c, Notice("finished", self.namespace, prompt_id))

    def release(self, prompt_ids: Iterable[str]) -> None:
        """Give held captures back (on shutdown), so that another server takes them at once."""
        ids = list(prompt_ids)
        if ids:
            with self.db.transaction() as c:
                c.execute(
                    CAPTURES.update()
                    .where(self._mine(), CAPTURES.c.prompt_id.in_(ids))
                    .values(status="queued", owner=None, lease_expires_at=None, attempts=CAPTURES.c.attempts - 1)
                )
                self.db.notices.send(c, Notice("queued", self.namespace))

    def state(self, prompt_id: str) -> CaptureState | None:
        """One prompt's capture state, or None if it never needed the target."""
        with self.db.read() as c:
            return self._state(c, prompt_id)

    def states(self) -> dict[str, CaptureState]:
        """Every prompt's capture state (one query, for listings)."""
        columns = (CAPTURES.c[n] for n in ("prompt_id", "status", "owner", "error", "published"))
        with self.db.read() as c:
            rows = c.execute(select(*columns).where(CAPTURES.c.namespace == self.namespace))
            return {r.prompt_id: CaptureState(r.status, r.owner, r.error, bool(r.published)) for r in rows}

    def unwritten(self) -> dict[str, tuple[int, ...]]:
        """The layers each queued or running capture will write (one query, for the free-space check)."""
        columns = (CAPTURES.c.prompt_id, CAPTURES.c.layers, CAPTURES.c.more)
        busy = CAPTURES.c.status.in_(("queued", "running"))
        with self.db.read() as c:
            rows = c.execute(select(*columns).where(CAPTURES.c.namespace == self.namespace, busy))
            return {r.prompt_id: tuple(sorted(set(json.loads(r.layers)) | set(json.loads(r.more)))) for r in rows}

    def _mine(self) -> ColumnElement[bool]:
        return and_(
            CAPTURES.c.namespace == self.namespace, CAPTURES.c.status == "running", CAPTURES.c.owner == self.owner
        )

    def _row(self, c: Connection, prompt_id: str, *, lock: bool = False) -> Row[Any] | None:
        query = select(CAPTURES).where(CAPTURES.c.namespace == self.namespace, CAPTURES.c.prompt_id == prompt_id)
        return c.execute(query.with_for_update() if lock else query).first()

    def _state(self, c: Connection, prompt_id: str) -> CaptureState | None:
        row = self._row(c, prompt_id)
        return None if row is None else CaptureState(row.status, row.owner, row.error, bool(row.published))

    def _update(self, c: Connection, prompt_id: str, **values: object) -> None:
        c.execute(
            CAPTURES.update()
            .where(CAPTURES.c.namespace == self.namespace, CAPTURES.c.prompt_id == prompt_id)
            .values(**values)
        )
