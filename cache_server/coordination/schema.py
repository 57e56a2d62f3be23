"""The coordination schema's version, and how a database written by an older server is brought up to
it, on SQLite and Postgres alike, in the serialized transaction that opens it.

Versions 1-4 were the jobs table's own, kept in SQLite's `PRAGMA user_version` before the
`schema_version` table existed (Postgres databases started at 4). Version 7 keeps a job's options as
one `spec` column (the job's `EvalSpec`), filled from the columns that held them one each; version 8
adds a running job's progress and its cancellation. A database
that names a newer version than this server knows is refused rather than written with an older schema."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, inspect, select

from cache_server.coordination.tables import JOBS, METADATA, SCHEMA_VERSION_TABLE
from schemas.eval_spec import EvalSpec

SCHEMA_VERSION = 8
Step = str | Callable[[Connection], None]  # SQL, or Python written once for both dialects


def _specs_from_columns(c: Connection) -> None:
    """Each job's `spec` from the columns that held its options. A row whose options form no spec (two
    families' options: the worker refused such a job) keeps the default spec and, if it was still to
    run, fails saying why."""
    old = ("tree_budgets", "target_layer_ids", "block_size", "steps", "eagle_trees", "layer_convention", "sets")
    rows = c.execute(select(JOBS.c.job_id, JOBS.c.status, JOBS.c.draft_sampling, *(JOBS.c[n] for n in old))).all()
    for row in rows:
        values: dict[str, Any] = {}
        try:
            spec = EvalSpec.model_validate(_flat(row._mapping))
        except ValidationError as e:
            spec = EvalSpec()
            if row.status in ("queued", "running"):
                why = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
                values = {"status": "failed", "finished_at": time.time(), "lease": None, "lease_expires_at": None}
                values["error"] = f"its options form no evaluation spec: {why}; submit it again"
        c.execute(JOBS.update().where(JOBS.c.job_id == row.job_id).values(spec=spec.model_dump_json(), **values))


def _flat(row: Any) -> dict[str, Any]:
    """A version 6 row's options as the flat fields of a body written before the family blocks."""
    return {
        "tree_budgets": json.loads(row["tree_budgets"] or "[]"),
        "target_layer_ids": json.loads(row["target_layer_ids"]) if row["target_layer_ids"] else None,
        "block_size": row["block_size"],
        "steps": row["steps"],
        "eagle_trees": json.loads(row["eagle_trees"] or "[]"),
        "layer_convention": row["layer_convention"],
        "sets": json.loads(row["sets"] or "[]"),
        "draft_sampling": row["draft_sampling"] or "greedy",
    }


# What a database at each version lacks, in order. 1-3 only ever meet SQLite (the `rowid`).
MIGRATIONS: dict[int, tuple[Step, ...]] = {
    1: (
        "ALTER TABLE jobs ADD COLUMN steps INTEGER",
        "ALTER TABLE jobs ADD COLUMN eagle_trees TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN layer_convention TEXT",
    ),
    2: ("ALTER TABLE jobs ADD COLUMN sets TEXT NOT NULL DEFAULT '[]'",),
    3: ("ALTER TABLE jobs ADD COLUMN seq INTEGER", "UPDATE jobs SET seq = rowid"),  # submission order
    4: ("CREATE INDEX IF NOT EXISTS jobs_claim_order ON jobs (status, seq)",),
    5: ("ALTER TABLE jobs ADD COLUMN draft_sampling TEXT NOT NULL DEFAULT 'greedy'",),
    6: ("ALTER TABLE jobs ADD COLUMN spec TEXT NOT NULL DEFAULT '{}'", _specs_from_columns),
    7: ("ALTER TABLE jobs ADD COLUMN progress TEXT", "ALTER TABLE jobs ADD COLUMN cancel_requested_at FLOAT"),
}
_LEGACY_TABLES = {"registrations", "set_members", "captures", "jobs"}


class SchemaTooNew(RuntimeError):
    """The database was written by a newer server."""


def prepare_schema(c: Connection, location: str) -> int:
    """Create the tables a new or partial database lacks and migrate older ones to SCHEMA_VERSION;
    the version the database was at (0: new)."""
    version = stored_version(c)
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"{location} has coordination schema version {version}; this server knows {SCHEMA_VERSION}")
    METADATA.create_all(c)  # missing tables only, each with its indexes; existing ones are migrated below
    for old in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
        for step in MIGRATIONS[old]:
            if isinstance(step, str):
                c.exec_driver_sql(step)
            else:
                step(c)
    if version != SCHEMA_VERSION:
        c.execute(SCHEMA_VERSION_TABLE.delete())
        c.execute(SCHEMA_VERSION_TABLE.insert().values(version=SCHEMA_VERSION))
    return version


def stored_version(c: Connection) -> int:
    """The schema version the database holds: 0 when it has no coordination table yet."""
    tables = set(inspect(c).get_table_names())
    if SCHEMA_VERSION_TABLE.name in tables:
        found: int = c.execute(select(SCHEMA_VERSION_TABLE.c.version)).scalar_one()
        return found
    if not tables & _LEGACY_TABLES:
        return 0
    if c.dialect.name == "sqlite" and "jobs" in tables:  # 0: its jobs table was created at version 4
        legacy: int = c.exec_driver_sql("PRAGMA user_version").scalar_one()
        return legacy or 4
    return 4
