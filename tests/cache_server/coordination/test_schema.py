"""One module declares every coordination table and one `schema_version` row says which schema a
database holds: a database opened by any part of the project gets every table, an older one is
migrated in place (on SQLite and Postgres alike), and a newer one is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import inspect, select

from cache_server.coordination.database import Database
from cache_server.coordination.schema import SCHEMA_VERSION, SchemaTooNew
from cache_server.coordination.tables import METADATA, SCHEMA_VERSION_TABLE


def _tables_and_indexes(db: Database) -> tuple[set[str], set[str]]:
    with db.read() as c:
        found = inspect(c)
        tables = set(found.get_table_names())
        indexes = {str(i["name"]) for t in tables for i in found.get_indexes(t)}
    return tables, indexes


def _version(db: Database) -> int:
    with db.read() as c:
        version: int = c.execute(select(SCHEMA_VERSION_TABLE.c.version)).scalar_one()
    return version


def test_a_database_opened_alone_has_every_table(db_location: str) -> None:
    # The database module alone, in a fresh interpreter: no table may depend on what else was imported.
    code = f"from cache_server.coordination.database import Database; Database({db_location!r}).close()"
    subprocess.run([sys.executable, "-c", code], check=True)
    db = Database(db_location)
    try:
        tables, indexes = _tables_and_indexes(db)
        assert tables == set(METADATA.tables)
        assert {"jobs_claim_order", "captures_by_status", "registrations_by_seq"} <= indexes
        assert (db.opened_at_version, _version(db)) == (SCHEMA_VERSION, SCHEMA_VERSION)
    finally:
        db.close()


def test_a_database_at_the_last_version_is_migrated(db_location: str) -> None:
    db = Database(db_location)
    with db.transaction() as c:  # what a server of version 4 left: no version table, no claim-order index,
        c.exec_driver_sql("DROP INDEX jobs_claim_order")  # no drafting mode
        c.exec_driver_sql("DROP TABLE schema_version")
        c.exec_driver_sql("ALTER TABLE jobs DROP COLUMN draft_sampling")
        c.exec_driver_sql(
            "INSERT INTO jobs (job_id, status, checkpoint, checkpoint_relative, prompts, tree_budgets, max_attempts, "
            "created_at) VALUES ('old', 'queued', '/c', 'c', '\"all\"', '[]', 3, 0)"
        )
    db.close()
    db = Database(db_location)
    try:
        assert db.opened_at_version == 4
        assert "jobs_claim_order" in _tables_and_indexes(db)[1]
        assert _version(db) == SCHEMA_VERSION
        with db.read() as c:  # version 6: a job of an older server drafts greedily, as it did
            assert c.exec_driver_sql("SELECT draft_sampling FROM jobs WHERE job_id = 'old'").scalar_one() == "greedy"
    finally:
        db.close()


def test_a_database_of_a_newer_server_is_refused(db_location: str) -> None:
    db = Database(db_location)
    with db.transaction() as c:
        c.execute(SCHEMA_VERSION_TABLE.update().values(version=SCHEMA_VERSION + 1))
    db.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}; this server knows {SCHEMA_VERSION}"):
        Database(db_location)
