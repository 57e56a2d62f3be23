"""The job table: its schema, and a row read back as the wire's `JobState`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import CheckConstraint, Column, Float, Index, Integer, Table, Text

from cache_server.coordination.database import METADATA
from schemas.jobs import JobState, JobStatus

# SQLite job databases carry `PRAGMA user_version`; what each older version lacks, in order, is
# added when a server opens one. (Postgres databases start at the current version.)
SCHEMA_VERSION = 4
MIGRATIONS = {
    1: (
        "ALTER TABLE jobs ADD COLUMN steps INTEGER",
        "ALTER TABLE jobs ADD COLUMN eagle_trees TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN layer_convention TEXT",
    ),
    2: ("ALTER TABLE jobs ADD COLUMN sets TEXT NOT NULL DEFAULT '[]'",),
    3: ("ALTER TABLE jobs ADD COLUMN seq INTEGER", "UPDATE jobs SET seq = rowid"),  # submission order
}
JOBS = Table(
    "jobs",
    METADATA,
    Column("job_id", Text, primary_key=True),
    Column("seq", Integer),  # submission order: 1 + the largest so far, inside the submitting transaction
    Column("status", Text, CheckConstraint("status IN ('queued', 'running', 'done', 'failed')"), nullable=False),
    Column("checkpoint", Text, nullable=False),
    Column("checkpoint_relative", Text, nullable=False),
    Column("prompts", Text, nullable=False),  # JSON: "all" or a list of prompt ids
    Column("tree_budgets", Text, nullable=False),  # JSON list
    Column("target_layer_ids", Text),  # JSON list or NULL
    Column("block_size", Integer),
    Column("steps", Integer),  # EAGLE-3 chain length or NULL
    Column("eagle_trees", Text, nullable=False, server_default="[]"),  # JSON list of "TOPK,DEPTH,TOTAL"
    Column("layer_convention", Text),
    Column("sets", Text, nullable=False, server_default="[]"),  # JSON list of prompt set names
    Column("target_fingerprint", Text),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False),
    Column("worker", Text),
    Column("lease", Text),
    Column("lease_s", Float),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("lease_expires_at", Float),
    Column("error", Text),
    Column("report", Text),  # EvalReport JSON, set once when done
    Index("jobs_by_status", "status"),
)
STATE_COLUMNS = [JOBS.c[name] for name in (
    "job_id", "status", "checkpoint", "checkpoint_relative", "prompts", "tree_budgets", "target_layer_ids",
    "block_size", "steps", "eagle_trees", "layer_convention", "sets", "target_fingerprint", "attempts",
    "max_attempts", "worker", "created_at", "started_at", "finished_at", "lease_expires_at", "error",
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
        tree_budgets=json.loads(row["tree_budgets"]),
        target_layer_ids=json.loads(row["target_layer_ids"]) if row["target_layer_ids"] else None,
        block_size=row["block_size"],
        steps=row["steps"],
        eagle_trees=json.loads(row["eagle_trees"]),
        layer_convention=row["layer_convention"],
        sets=json.loads(row["sets"]),
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
