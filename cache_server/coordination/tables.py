"""The coordination tables of the prompt side, per store namespace (a target's fingerprint):
registrations, prompt-set membership and capture work. Each has a `seq` in insertion order, so a
server catches up with what others added by reading only the rows after the last one it saw."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, Table, Text

from cache_server.coordination.database import METADATA

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
