"""Checkpoint evaluation jobs in the coordination database: submit, claim under a lease, report
progress with the renewals, finish; cancel a running job (its worker learns it at its next renewal).

Every change locks the rows it reads (`SELECT ... FOR UPDATE`, claims `SKIP LOCKED`; SQLite
serializes its writes), so two claimers never get the same job and a job stores exactly one report: a
worker whose lease was taken over cannot complete it. Reads are lock-free snapshots. Any number of
servers may share the database (SQLite on one node, Postgres on many).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Text, and_, case, cast, func, literal, or_, select

from cache_server.coordination.database import Database, max_seq
from cache_server.coordination.tables import JOBS
from cache_server.errors import JobFailed, JobNotFound, LeaseLost, ReportNotReady
from cache_server.jobs.rows import STATE_COLUMNS, job_state, status_is, wire_status
from schemas.jobs import JobPage, JobProgress, JobState, JobStatus, JobSubmit

Row = Mapping[Any, Any]


@dataclass(frozen=True)
class Leased:
    """A claimed job and the lease that renew/complete/fail must quote."""

    job: JobState
    lease: str


class JobStore:
    """The job table; `now` is the clock (seconds since the epoch), injectable for lease tests.

    `db` is an open `Database` (shared, not closed here) or a location to open one at."""

    def __init__(
        self, db: Database | Path | str, *, max_attempts: int = 3, now: Callable[[], float] = time.time
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self._owned = not isinstance(db, Database)
        self.db = Database(str(db)) if not isinstance(db, Database) else db
        self.max_attempts = max_attempts
        self._now = now

    def close(self) -> None:
        """Close the database if this store opened it."""
        if self._owned:
            self.db.close()

    # -- submission and reads -------------------------------------------------------------------

    def submit(self, spec: JobSubmit, *, checkpoint_relative: str, target_fingerprint: str | None = None) -> JobState:
        """Queue a job; `spec.checkpoint` (and `spec.config`) must already be the resolved paths the worker
        will open."""
        job_id = uuid.uuid4().hex
        with self.db.transaction(ordered=True) as c:
            seq = max_seq(c, JOBS.c.seq) + 1
            c.execute(
                JOBS.insert().values(
                    job_id=job_id,
                    seq=seq,
                    status="queued",
                    checkpoint=spec.checkpoint,
                    checkpoint_relative=checkpoint_relative,
                    prompts=json.dumps(spec.prompts),
                    spec=spec.eval_spec().model_dump_json(),  # every field: read back as it was asked
                    tree_budgets="[]",  # unused since version 7, but NOT NULL without a default in older tables
                    target_fingerprint=target_fingerprint,
                    max_attempts=self.max_attempts,
                    created_at=self._now(),
                )
            )
            return self._get(c, job_id)

    def get(self, job_id: str) -> JobState:
        """One job's state; JobNotFound if there is none."""
        self._settle_exhausted()
        with self.db.read() as c:
            return self._get(c, job_id)

    def page(self, offset: int = 0, limit: int = 100, status: JobStatus | None = None) -> JobPage:
        """Jobs in submission order."""
        where = status_is(status) if status is not None else literal(True)
        self._settle_exhausted()
        with self.db.read() as c:
            total = c.execute(select(func.count()).select_from(JOBS).where(where)).scalar_one()
            rows = c.execute(select(*STATE_COLUMNS).where(where).order_by(JOBS.c.seq).limit(limit).offset(offset))
            jobs = [job_state(r._mapping) for r in rows]
        return JobPage(jobs=jobs, total=total, offset=offset, limit=limit)

    def delete(self, job_id: str) -> JobState | None:
        """Remove a job that is not running, with its report (its row locked: no claim slips in); a
        running one is cancelled instead: its state, cancelling until its worker stops."""
        self._settle_exhausted()
        with self.db.transaction() as c:
            row = self._row(c, job_id, JOBS.c.status, JOBS.c.cancel_requested_at, lock=True)
            if row["status"] == JobStatus.running:
                if row["cancel_requested_at"] is None:
                    c.execute(JOBS.update().where(JOBS.c.job_id == job_id).values(cancel_requested_at=self._now()))
                return self._get(c, job_id)
            c.execute(JOBS.delete().where(JOBS.c.job_id == job_id))
            return None

    def done_reports(self, offset: int = 0, limit: int = 100) -> tuple[list[tuple[JobState, str]], int]:
        """Done jobs in submission order with their EvalReport JSON, and how many are done in all."""
        done = JOBS.c.status == "done"
        with self.db.read() as c:
            total = c.execute(select(func.count()).select_from(JOBS).where(done)).scalar_one()
            rows = c.execute(
                select(*STATE_COLUMNS, JOBS.c.report).where(done).order_by(JOBS.c.seq).limit(limit).offset(offset)
            )
            return [(job_state(r._mapping), str(r.report)) for r in rows], total

    def layer_sets_since(self, since: float) -> list[tuple[tuple[int, ...], float]]:
        """The layer ids each job done at `since` or later read (from its report), with when it finished."""
        done = and_(JOBS.c.status == "done", JOBS.c.finished_at >= since)
        with self.db.read() as c:
            rows = c.execute(select(JOBS.c.report, JOBS.c.finished_at).where(done).order_by(JOBS.c.seq)).all()
        return [(tuple(json.loads(r.report)["target_layer_ids"]), float(r.finished_at)) for r in rows]

    def report(self, job_id: str) -> str:
        """The stored EvalReport JSON of a done job."""
        self._settle_exhausted()
        with self.db.read() as c:
            cols = ("status", "cancel_requested_at", "attempts", "max_attempts", "error", "report")
            row = self._row(c, job_id, *(JOBS.c[n] for n in cols))
        status = wire_status(row["status"], row["cancel_requested_at"])
        if status == JobStatus.done:
            return str(row["report"])
        if status in (JobStatus.failed, JobStatus.cancelled):
            what = "failed" if status == JobStatus.failed else "was cancelled"
            raise JobFailed(f"job {job_id} {what}, so it has no report: {row['error']}")
        raise ReportNotReady(
            f"job {job_id} is {status} (attempt {row['attempts']} of {row['max_attempts']}); its report is not ready"
        )

    # -- worker protocol ------------------------------------------------------------------------

    def claim(self, worker: str, lease_s: float) -> Leased | None:
        """The oldest queued job, or running one whose lease expired, now leased to `worker`."""
        self._settle_exhausted()
        now = self._now()
        expired = and_(
            JOBS.c.status == "running", JOBS.c.lease_expires_at <= now, JOBS.c.cancel_requested_at.is_(None)
        )  # an expired cancelling job is settled cancelled, never run again
        claimable = or_(JOBS.c.status == "queued", expired)
        if not self.db.any(select(JOBS.c.job_id).where(claimable)):  # an idle worker's poll takes no lock
            return None
        with self.db.transaction() as c:
            row = c.execute(
                select(JOBS.c.job_id, JOBS.c.status, JOBS.c.worker, JOBS.c.attempts)
                .where(claimable)
                .order_by(JOBS.c.seq)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            error: str | None = None
            if row.status == JobStatus.running:
                error = f"lease expired on worker {row.worker} (attempt {row.attempts})"
            lease = secrets.token_urlsafe(18)
            c.execute(
                JOBS.update()
                .where(JOBS.c.job_id == row.job_id)
                .values(
                    status="running",
                    attempts=JOBS.c.attempts + 1,
                    worker=worker,
                    lease=lease,
                    lease_s=lease_s,
                    started_at=now,
                    lease_expires_at=now + lease_s,
                    error=func.coalesce(error, JOBS.c.error),
                    progress=None,
                )
            )
            return Leased(self._get(c, row.job_id), lease)

    def renew(
        self, job_id: str, lease: str, lease_s: float | None = None, progress: JobProgress | None = None
    ) -> JobState:
        """Extend a held lease by `lease_s` (default: the claim's) from now, storing the worker's
        `progress` when given; the state says cancelling once the job's cancel was asked."""
        self._settle_exhausted()
        now = self._now()
        with self.db.transaction() as c:
            held = self._held(c, job_id, lease)
            seconds = lease_s if lease_s is not None else float(held["lease_s"])
            values: dict[str, Any] = {"lease_expires_at": now + seconds, "lease_s": seconds}
            if progress is not None:
                stamped = progress.model_copy(update={"reported_at": datetime.fromtimestamp(now, UTC)})
                values["progress"] = stamped.model_dump_json()
            c.execute(JOBS.update().where(JOBS.c.job_id == job_id).values(**values))
            return self._get(c, job_id)

    def complete(self, job_id: str, lease: str, report_json: str) -> JobState:
        """Store the one report of the job and mark it done; LeaseLost (report dropped) otherwise."""
        self._settle_exhausted()
        with self.db.transaction() as c:
            self._held(c, job_id, lease)
            c.execute(
                JOBS.update()
                .where(JOBS.c.job_id == job_id)
                .values(
                    status="done",
                    report=report_json,
                    finished_at=self._now(),
                    lease=None,
                    lease_expires_at=None,
                    error=None,
                )
            )
            return self._get(c, job_id)

    def fail(self, job_id: str, lease: str, error: str, *, retryable: bool) -> JobState:
        """Give a held job back: queued again if retryable with attempts left, else failed (cancelled,
        whatever the error, once its cancel was asked)."""
        self._settle_exhausted()
        with self.db.transaction() as c:
            held = self._held(c, job_id, lease)
            attempts, most = held["attempts"], held["max_attempts"]
            if held["cancel_requested_at"] is not None:
                error = f"cancelled: {error}"
            elif retryable and attempts < most:
                c.execute(
                    JOBS.update()
                    .where(JOBS.c.job_id == job_id)
                    .values(status="queued", lease=None, lease_expires_at=None, error=error)
                )
                return self._get(c, job_id)
            elif retryable:
                error = f"{error} (gave up after {attempts} attempts)"
            c.execute(
                JOBS.update()
                .where(JOBS.c.job_id == job_id)
                .values(status="failed", finished_at=self._now(), lease=None, lease_expires_at=None, error=error)
            )
            return self._get(c, job_id)

    # -- helpers (inside a transaction) ---------------------------------------------------------

    def _settle_exhausted(self) -> None:
        """A running job whose lease expired on its last attempt has failed, and a cancelling one whose
        lease expired is cancelled: say so before any read or change (a lock-free look; a write,
        serialized, only when there is one)."""
        now = self._now()
        cancelling = JOBS.c.cancel_requested_at.is_not(None)
        exhausted = and_(
            JOBS.c.status == "running",
            JOBS.c.lease_expires_at <= now,
            or_(JOBS.c.attempts >= JOBS.c.max_attempts, cancelling),
        )
        if not self.db.any(select(JOBS.c.job_id).where(exhausted)):
            return
        worker = func.coalesce(JOBS.c.worker, "?")
        error = case(
            (cancelling, literal("cancelled: the lease expired on worker ", Text) + worker + " before it stopped"),
            else_=literal("lease expired on worker ", Text)
            + worker
            + " after "
            + cast(JOBS.c.attempts, Text)
            + " attempts",
        )
        with self.db.transaction(ordered=True) as c:
            c.execute(
                JOBS.update()
                .where(exhausted)
                .values(status="failed", finished_at=now, lease=None, lease_expires_at=None, error=error)
            )

    def _row(self, c: Connection, job_id: str, *columns: Any, lock: bool = False) -> Row:
        query = select(*columns).where(JOBS.c.job_id == job_id)
        row = c.execute(query.with_for_update() if lock else query).first()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return row._mapping

    def _get(self, c: Connection, job_id: str) -> JobState:
        return job_state(self._row(c, job_id, *STATE_COLUMNS))

    def _held(self, c: Connection, job_id: str, lease: str) -> Row:
        """The job's row if `lease` is its current lease (expired but not yet taken over counts)."""
        cols = ("status", "lease", "lease_s", "worker", "attempts", "max_attempts", "cancel_requested_at")
        row = self._row(c, job_id, *(JOBS.c[n] for n in cols), lock=True)
        if row["status"] == JobStatus.running and row["lease"] is not None:
            if secrets.compare_digest(str(row["lease"]).encode(), lease.encode()):
                return row
            raise LeaseLost(
                f"job {job_id} was claimed again by worker {row['worker']} (attempt {row['attempts']}); "
                "this lease is no longer valid"
            )
        raise LeaseLost(f"job {job_id} is {row['status']}; this lease is no longer valid")
