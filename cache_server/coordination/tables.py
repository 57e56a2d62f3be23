"""Every coordination table, declared here and nowhere else, so that every server creates the same
schema whatever it imports: per store namespace (a target's fingerprint) the registrations,
prompt-set membership and capture work; the evaluation jobs; and the schema's version.

The prompt-side tables have a `seq` in insertion order, so a server catches up with what others
added by reading only the rows after the last one it saw."""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, Column, Float, Index, Integer, MetaData, Table, Text

METADATA = MetaData()

# One row: the version of this schema the database holds (`schema.py` brings older ones up to date).
SCHEMA_VERSION_TABLE = Table("schema_version", METADATA, Column("version", Integer, nullable=False))

REGISTRATIONS = Table(
    "registrations",
    METADATA,
    Column("namespace", Text, primary_key=True),
    Column("prompt_id", Text, primary_key=True),
    Column("seq", Integer, nullable=False),
    Column("body", Text, nullable=False),  # the Registration's JSON (immutable: the id is its content)
    Index("registrations_by_seq", "namespace", "seq"),
)

SET_MEMBERS = Table(
    "set_members",
    METADATA,
    Column("namespace", Text, primary_key=True),
    Column("set_name", Text, primary_key=True),
    Column("prompt_id", Text, primary_key=True),
    Column("seq", Integer, nullable=False),
    Index("set_members_by_seq", "namespace", "seq"),
)

# One row per prompt that ever needed the target: what to compute and who is computing it.
CAPTURES = Table(
    "captures",
    METADATA,
    Column("namespace", Text, primary_key=True),
    Column("prompt_id", Text, primary_key=True),
    Column("seq", Integer, nullable=False),  # first come, first claimed
    Column("status", Text, nullable=False),  # queued | running | done | failed
    Column("layers", Text, nullable=False),  # JSON list: what the queued or running capture computes
    Column("more", Text, nullable=False),  # JSON list: asked for while running, queued once it is done
    Column("owner", Text),  # the server instance running it
    Column("lease_expires_at", Float),
    Column("attempts", Integer, nullable=False),
    Column("error", Text),
    Column("published", Boolean, nullable=False),  # some capture of it was published: the prompt is ready
    Index("captures_by_status", "namespace", "status", "seq"),
)

# Checkpoint evaluation jobs, one row each, with the report stored once when done.
JOBS = Table(
    "jobs",
    METADATA,
    Column("job_id", Text, primary_key=True),
    Column("seq", Integer),  # submission order: 1 + the largest so far, inside the submitting transaction
    Column("status", Text, CheckConstraint("status IN ('queued', 'running', 'done', 'failed')"), nullable=False),
    Column("checkpoint", Text, nullable=False),
    Column("checkpoint_relative", Text, nullable=False),
    Column("prompts", Text, nullable=False),  # JSON: "all" or a list of prompt ids
    Column("spec", Text, nullable=False, server_default="{}"),  # the job's EvalSpec JSON, every field written
    # The options one column each, as versions before 7 stored them: read once by the migration to 7
    # (into `spec`), unused since; kept because SQLite before 3.35 cannot drop a column.
    Column("tree_budgets", Text, nullable=False, server_default="[]"),
    Column("target_layer_ids", Text),
    Column("block_size", Integer),
    Column("steps", Integer),
    Column("eagle_trees", Text, nullable=False, server_default="[]"),
    Column("layer_convention", Text),
    Column("sets", Text, nullable=False, server_default="[]"),
    Column("draft_sampling", Text, nullable=False, server_default="greedy"),
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
    Column("progress", Text),  # JobProgress JSON, as the worker last reported it with a renewal
    # Set by DELETE of a running job: `status` keeps its four values (older tables check them), and
    # running + this is "cancelling", failed + this is "cancelled" (`cache_server/jobs/rows.py`).
    Column("cancel_requested_at", Float),
    Index("jobs_by_status", "status"),
    Index("jobs_claim_order", "status", "seq"),  # claims and listings: oldest of a status first
)
