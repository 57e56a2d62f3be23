"""A `jobs` row read back as the wire's `JobState` (its options: the `spec` column's `EvalSpec`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cache_server.coordination.tables import JOBS
from schemas.eval_spec import EvalSpec
from schemas.jobs import JobState, JobStatus

STATE_COLUMNS = [JOBS.c[name] for name in (
    "job_id", "status", "checkpoint", "checkpoint_relative", "prompts", "spec", "target_fingerprint",
    "attempts", "max_attempts", "worker", "created_at", "started_at", "finished_at", "lease_expires_at", "error",
)]  # fmt: skip


def _time(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


def job_state(row: Mapping[Any, Any]) -> JobState:
    """A `jobs` row (of STATE_COLUMNS) as the job's state."""
    return JobState(
        job_id=row["job_id"],
        status=JobStatus(row["status"]),
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
    )
