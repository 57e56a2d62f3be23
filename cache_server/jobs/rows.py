"""A `jobs` row read back as the wire's `JobState` (its options: the `spec` column's `EvalSpec`), and
the wire's statuses as conditions on rows: `status` holds queued, running, done or failed, and a
cancelled DELETE (`cancel_requested_at`) turns running into cancelling and failed into cancelled."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_

from cache_server.coordination.tables import JOBS
from schemas.eval_spec import EvalSpec
from schemas.jobs import JobProgress, JobState, JobStatus

STATE_COLUMNS = [JOBS.c[name] for name in (
    "job_id", "status", "checkpoint", "checkpoint_relative", "prompts", "spec", "target_fingerprint",
    "attempts", "max_attempts", "worker", "created_at", "started_at", "finished_at", "lease_expires_at", "error",
    "progress", "cancel_requested_at",
)]  # fmt: skip

_CANCELLED_AS = {JobStatus.running: JobStatus.cancelling, JobStatus.failed: JobStatus.cancelled}
_STORED_AS = {v: k for k, v in _CANCELLED_AS.items()}


def _time(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


def wire_status(status: str, cancel_requested_at: float | None) -> JobStatus:
    """The status a row shows: its stored one, or what a requested cancel makes of it."""
    stored = JobStatus(status)
    return _CANCELLED_AS.get(stored, stored) if cancel_requested_at is not None else stored


def status_is(status: JobStatus) -> ColumnElement[bool]:
    """The rows a listing of `status` holds."""
    stored = _STORED_AS.get(status, status)
    cancelled = status in _STORED_AS
    requested = JOBS.c.cancel_requested_at.is_not(None) if cancelled else JOBS.c.cancel_requested_at.is_(None)
    if stored not in _CANCELLED_AS:  # queued and done rows show their status whatever was asked
        return JOBS.c.status == stored.value
    return and_(JOBS.c.status == stored.value, requested)


def job_state(row: Mapping[Any, Any]) -> JobState:
    """A `jobs` row (of STATE_COLUMNS) as the job's state."""
    return JobState(
        job_id=row["job_id"],
        status=wire_status(row["status"], row["cancel_requested_at"]),
        checkpoint=row["checkpoint"],
        checkpoint_relative=row["checkpoint_relative"],
        prompts=json.loads(row["prompts"]),
        spec=EvalSpec.model_validate_json(row["spec"]),
        target_fingerprint=row["target_fingerprint"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        worker=row["worker"],
        created_at=datetime.fromtimestamp(row["created_at"], UTC),
        started_at=_time(row["started_at"]),
        finished_at=_time(row["finished_at"]),
        lease_expires_at=_time(row["lease_expires_at"]),
        error=row["error"],
        progress=JobProgress.model_validate_json(row["progress"]) if row["progress"] else None,
    )
