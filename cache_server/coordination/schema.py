"""The coordination schema's version, and how a database written by an older server is brought up to
it, on SQLite and Postgres alike, in the serialized transaction that opens it.

Versions 1-4 were the jobs table's own, kept in SQLite's `PRAGMA user_version` before the
`schema_version` table existed (Postgres databases started at 4). A database that names a newer
version than this server knows is refused rather than written with an older schema."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, select

from cache_server.coordination.tables import METADATA, SCHEMA_VERSION_TABLE

SCHEMA_VERSION = 6
# What a database at each version lacks, in order. 1-3 only ever meet SQLite (the `rowid`).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE jobs ADD COLUMN steps INTEGER",
        "ALTER TABLE jobs ADD COLUMN eagle_trees TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN layer_convention TEXT",
    ),
    2: ("ALTER TABLE jobs ADD COLUMN sets TEXT NOT NULL DEFAULT '[]'",),
    3: ("ALTER TABLE jobs ADD COLUMN seq INTEGER", "UPDATE jobs SET seq = rowid"),  # submission order
    4: ("CREATE INDEX IF NOT EXISTS jobs_claim_order ON jobs (status, seq)",),
    5: ("ALTER TABLE jobs ADD COLUMN draft_sampling TEXT NOT NULL DEFAULT 'greedy'",),
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
        for statement in MIGRATIONS[old]:
            c.exec_driver_sql(statement)
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
