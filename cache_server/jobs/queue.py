"""Checkpoint evaluation jobs in SQLite (`<store>/jobs.sqlite`): submit, claim under a lease, finish.

Every state change runs in one `BEGIN IMMEDIATE` transaction, so two claimers never get the same job
and a job stores exactly one report: a worker whose lease was taken over cannot complete it. Each
thread has its own connection; the file (WAL) may be shared by several stores and processes.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cache_server.errors import JobFailed, JobNotFound, JobRunning, LeaseLost, ReportNotReady
from cache_server.jobs.rows import MIGRATIONS, SCHEMA, SCHEMA_VERSION, STATE_COLUMNS, job_state
from schemas.jobs import JobPage, JobState, JobStatus, JobSubmit


@dataclass(frozen=True)
class Leased:
    """A claimed job and the lease that renew/complete/fail must quote."""

    job: JobState
    lease: str


class JobStore:
    """The job table; `now` is the clock (seconds since the epoch), injectable for lease tests."""

    def __init__(self, path: Path, *, max_attempts: int = 3, now: Callable[[], float] = time.time) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.path = path
        self.max_attempts = max_attempts
        self._now = now
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._write_lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, *MIGRATIONS, SCHEMA_VERSION):
            raise RuntimeError(f"{path} has job schema version {version}; this server knows {SCHEMA_VERSION}")
        with conn:  # one transaction: a database is migrated whole or not at all
            for old in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
                for statement in MIGRATIONS[old]:
                    conn.execute(statement)
        conn.executescript(SCHEMA)  # idempotent, so concurrent first opens are harmless
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- connections ----------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")  # a stored report survives a power cut too
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: the write lock is held from the first read to the commit."""
        conn = self._conn()
        with self._write_lock:  # threads of one process queue here instead of in SQLite's busy sleeps
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close every thread's connection."""
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    # -- submission and reads -------------------------------------------------------------------

    def submit(self, spec: JobSubmit, *, checkpoint_relative: str, target_fingerprint: str | None = None) -> JobState:
        """Queue a job; `spec.checkpoint` must already be the resolved path the worker will open."""
        job_id = uuid.uuid4().hex
        with self._write() as c:
            c.execute(
                "INSERT INTO jobs (job_id, status, checkpoint, checkpoint_relative, prompts, tree_budgets, "
                "target_layer_ids, block_size, steps, eagle_trees, layer_convention, sets, target_fingerprint, "
                "max_attempts, created_at) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    spec.checkpoint,
                    checkpoint_relative,
                    json.dumps(spec.prompts),
                    json.dumps(spec.tree_budgets),
                    json.dumps(spec.target_layer_ids) if spec.target_layer_ids is not None else None,
                    spec.block_size,
                    spec.steps,
                    json.dumps(spec.eagle_trees),
                    spec.layer_convention,
                    json.dumps(spec.sets),
                    target_fingerprint,
                    self.max_attempts,
                    self._now(),
                ),
            )
            return self._get(c, job_id)

    def get(self, job_id: str) -> JobState:
        """One job's state; JobNotFound if there is none."""
        with self._write() as c:
            self._fail_exhausted(c)
            return self._get(c, job_id)

    def page(self, offset: int = 0, limit: int = 100, status: JobStatus | None = None) -> JobPage:
        """Jobs in submission order."""
        where, args = ("WHERE status = ?", (status.value,)) if status is not None else ("", ())
        with self._write() as c:
            self._fail_exhausted(c)
            total = c.execute(f"SELECT COUNT(*) FROM jobs {where}", args).fetchone()[0]
            rows = c.execute(
                f"SELECT {STATE_COLUMNS} FROM jobs {where} ORDER BY rowid LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
        return JobPage(jobs=[job_state(r) for r in rows], total=total, offset=offset, limit=limit)

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running, with its report (one transaction: no claim slips in)."""
        with self._write() as c:
            self._fail_exhausted(c)
            if self._row(c, job_id, "status")["status"] == JobStatus.running:
                raise JobRunning(f"job {job_id} is running; it can be deleted once it is done or failed")
            c.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))

    def done_reports(self, offset: int = 0, limit: int = 100) -> tuple[list[tuple[JobState, str]], int]:
        """Done jobs in submission order with their EvalReport JSON, and how many are done in all."""
        with self._write() as c:
            total = c.execute("SELECT COUNT(*) FROM jobs WHERE status = 'done'").fetchone()[0]
            rows = c.execute(
                f"SELECT {STATE_COLUMNS}, report FROM jobs WHERE status = 'done' ORDER BY rowid LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return [(job_state(r), str(r["report"])) for r in rows], total

    def report(self, job_id: str) -> str:
        """The stored EvalReport JSON of a done job."""
        with self._write() as c:
            self._fail_exhausted(c)
            row = self._row(c, job_id, "status, attempts, max_attempts, error, report")
        if row["status"] == JobStatus.done:
            return str(row["report"])
        if row["status"] == JobStatus.failed:
            raise JobFailed(f"job {job_id} failed, so it has no report: {row['error']}")
        raise ReportNotReady(
            f"job {job_id} is {row['status']} (attempt {row['attempts']} of {row['max_attempts']}); "
            "its report is not ready"
        )

    # -- worker protocol ------------------------------------------------------------------------

    def claim(self, worker: str, lease_s: float) -> Leased | None:
        """The oldest queued job, or running one whose lease expired, now leased to `worker`."""
        now = self._now()
        with self._write() as c:
            self._fail_exhausted(c)
            row = c.execute(
                "SELECT job_id, status, worker, attempts, max_attempts FROM jobs "
                "WHERE status = 'queued' OR (status = 'running' AND lease_expires_at <= ?) "
                "ORDER BY rowid LIMIT 1",
                (now,),
            ).fetchone()
            if row is None:
                return None
            error: str | None = None
            if row["status"] == JobStatus.running:
                error = f"lease expired on worker {row['worker']} (attempt {row['attempts']})"
            lease = secrets.token_urlsafe(18)
            c.execute(
                "UPDATE jobs SET status = 'running', attempts = attempts + 1, worker = ?, lease = ?, "
                "lease_s = ?, started_at = ?, lease_expires_at = ?, error = COALESCE(?, error) "
                "WHERE job_id = ?",
                (worker, lease, lease_s, now, now + lease_s, error, row["job_id"]),
            )
            return Leased(self._get(c, row["job_id"]), lease)

    def renew(self, job_id: str, lease: str, lease_s: float | None = None) -> JobState:
        """Extend a held lease by `lease_s` (default: the claim's) from now."""
        now = self._now()
        with self._write() as c:
            self._fail_exhausted(c)
            held = self._held(c, job_id, lease)
            seconds = lease_s if lease_s is not None else float(held["lease_s"])
            c.execute(
                "UPDATE jobs SET lease_expires_at = ?, lease_s = ? WHERE job_id = ?",
                (now + seconds, seconds, job_id),
            )
            return self._get(c, job_id)

    def complete(self, job_id: str, lease: str, report_json: str) -> JobState:
        """Store the one report of the job and mark it done; LeaseLost (report dropped) otherwise."""
        with self._write() as c:
            self._fail_exhausted(c)
            self._held(c, job_id, lease)
            c.execute(
                "UPDATE jobs SET status = 'done', report = ?, finished_at = ?, lease = NULL, "
                "lease_expires_at = NULL, error = NULL WHERE job_id = ?",
                (report_json, self._now(), job_id),
            )
            return self._get(c, job_id)

    def fail(self, job_id: str, lease: str, error: str, *, retryable: bool) -> JobState:
        """Give a held job back: queued again if retryable with attempts left, else failed."""
        with self._write() as c:
            self._fail_exhausted(c)
            held = self._held(c, job_id, lease)
            attempts, most = held["attempts"], held["max_attempts"]
            if retryable and attempts < most:
                c.execute(
                    "UPDATE jobs SET status = 'queued', lease = NULL, lease_expires_at = NULL, error = ? "
                    "WHERE job_id = ?",
                    (error, job_id),
                )
            else:
                if retryable:
                    error = f"{error} (gave up after {attempts} attempts)"
                c.execute(
                    "UPDATE jobs SET status = 'failed', finished_at = ?, lease = NULL, "
                    "lease_expires_at = NULL, error = ? WHERE job_id = ?",
                    (self._now(), error, job_id),
                )
            return self._get(c, job_id)

    # -- helpers (inside a transaction) ---------------------------------------------------------

    def _fail_exhausted(self, c: sqlite3.Connection) -> None:
        """A running job whose lease expired on its last attempt has failed."""
        now = self._now()
        c.execute(
            "UPDATE jobs SET status = 'failed', finished_at = ?, lease = NULL, lease_expires_at = NULL, "
            "error = 'lease expired on worker ' || COALESCE(worker, '?') || ' after ' || attempts || "
            "' attempts' WHERE status = 'running' AND lease_expires_at <= ? AND attempts >= max_attempts",
            (now, now),
        )

    def _row(self, c: sqlite3.Connection, job_id: str, columns: str) -> sqlite3.Row:
        row: sqlite3.Row | None = c.execute(f"SELECT {columns} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return row

    def _get(self, c: sqlite3.Connection, job_id: str) -> JobState:
        return job_state(self._row(c, job_id, STATE_COLUMNS))

    def _held(self, c: sqlite3.Connection, job_id: str, lease: str) -> sqlite3.Row:
        """The job's row if `lease` is its current lease (expired but not yet taken over counts)."""
        row = self._row(c, job_id, "status, lease, lease_s, worker, attempts, max_attempts")
        if row["status"] == JobStatus.running and row["lease"] is not None:
            if secrets.compare_digest(str(row["lease"]).encode(), lease.encode()):
                return row
            raise LeaseLost(
                f"job {job_id} was claimed again by worker {row['worker']} (attempt {row['attempts']}); "
                "this lease is no longer valid"
            )
        raise LeaseLost(f"job {job_id} is {row['status']}; this lease is no longer valid")
