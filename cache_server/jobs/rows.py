"""The job table on disk: its SQL schema, and a row read back as the wire's `JobState`."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from schemas.jobs import JobState, JobStatus

SCHEMA_VERSION = 3
# What each older version lacks, in order: applied to a job database written by an older server.
MIGRATIONS = {
    1: (
        "ALTER TABLE jobs ADD COLUMN steps INTEGER",
        "ALTER TABLE jobs ADD COLUMN eagle_trees TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN layer_convention TEXT",
    ),
    2: ("ALTER TABLE jobs ADD COLUMN sets TEXT NOT NULL DEFAULT '[]'",),
}
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
    checkpoint TEXT NOT NULL,
    checkpoint_relative TEXT NOT NULL,
    prompts TEXT NOT NULL,            -- JSON: "all" or a list of prompt ids
    tree_budgets TEXT NOT NULL,       -- JSON list
    target_layer_ids TEXT,            -- JSON list or NULL
    block_size INTEGER,
    steps INTEGER,                    -- EAGLE-3 chain length or NULL
    eagle_trees TEXT NOT NULL DEFAULT '[]',  -- JSON list of "TOPK,DEPTH,TOTAL"
    layer_convention TEXT,
    sets TEXT NOT NULL DEFAULT '[]',  -- JSON list of prompt set names
    target_fingerprint TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    worker TEXT,
    lease TEXT,
    lease_s REAL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    lease_expires_at REAL,
    error TEXT,
    report TEXT                       -- EvalReport JSON, set once when done
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
"""
STATE_COLUMNS = (
    "job_id, status, checkpoint, checkpoint_relative, prompts, tree_budgets, target_layer_ids, block_size, "
    "steps, eagle_trees, layer_convention, sets, target_fingerprint, attempts, max_attempts, worker, created_at, "
    "started_at, finished_at, lease_expires_at, error"
)


def _time(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


def job_state(row: sqlite3.Row) -> JobState:
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
