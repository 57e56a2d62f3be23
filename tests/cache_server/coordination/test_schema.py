"""One module declares every coordination table and one `schema_version` row says which schema a
database holds: a database opened by any part of the project gets every table, an older one is
migrated in place (on SQLite and Postgres alike), and a newer one is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import inspect, select

from cache_server.coordination.database import Database
from cache_server.coordination.schema import SCHEMA_VERSION, SchemaTooNew
from cache_server.coordination.tables import METADATA, SCHEMA_VERSION_TABLE
from cache_server.jobs.queue import JobStore
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec
from schemas.jobs import JobStatus, JobSubmit
from schemas.report import Eagle3Drafting, EvalReport
from tests.cache_server.jobs_helpers import flat_report_body, write_v6_database


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
        c.exec_driver_sql("ALTER TABLE jobs DROP COLUMN spec")
        c.exec_driver_sql("ALTER TABLE jobs DROP COLUMN progress")
        c.exec_driver_sql("ALTER TABLE jobs DROP COLUMN cancel_requested_at")
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
        with db.read() as c:  # version 6: a job of an older server drafts greedily, as it did; 7: its spec says so
            assert c.exec_driver_sql("SELECT draft_sampling FROM jobs WHERE job_id = 'old'").scalar_one() == "greedy"
            spec = c.exec_driver_sql("SELECT spec FROM jobs WHERE job_id = 'old'").scalar_one()
        assert EvalSpec.model_validate_json(spec) == EvalSpec()
    finally:
        db.close()


def test_a_database_of_a_newer_server_is_refused(db_location: str) -> None:
    db = Database(db_location)
    with db.transaction() as c:
        c.execute(SCHEMA_VERSION_TABLE.update().values(version=SCHEMA_VERSION + 1))
    db.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {SCHEMA_VERSION + 1}; this server knows {SCHEMA_VERSION}"):
        Database(db_location)


def test_a_version_6_database_keeps_each_jobs_options_as_its_spec(db_location: str) -> None:
    """Version 7 reads each job's options from the columns that held them into one spec: queued jobs run
    as asked, done ones keep their reports (flat fields and all), and a job whose options belong to two
    families (which no worker could run) fails saying why, before any worker claims it."""
    flat = json.dumps(flat_report_body("eagle3"))
    write_v6_database(
        db_location,
        [
            {"job_id": "dflash", "tree_budgets": "[4, 8]", "target_layer_ids": "[1, 3, 5]", "block_size": 6,
             "sets": '["a"]', "draft_sampling": "probabilistic"},
            {"job_id": "eagle", "status": "done", "steps": 3, "eagle_trees": '["4,3,16"]',
             "layer_convention": "layer_input", "attempts": 1, "finished_at": 2.0, "report": flat},
            {"job_id": "mixed", "tree_budgets": "[4]", "steps": 3},
            {"job_id": "mixed-failed", "status": "failed", "tree_budgets": "[4]", "steps": 3, "error": "gave up"},
        ],
    )  # fmt: skip
    store = JobStore(db_location)
    try:
        assert store.db.opened_at_version == 6
        dflash = store.get("dflash")
        assert dflash.spec == EvalSpec(
            target_layer_ids=[1, 3, 5],
            sets=["a"],
            draft_sampling="probabilistic",
            family_options=DFlashOptions(tree_budgets=[4, 8], block_size=6),
        )
        assert (dflash.tree_budgets, dflash.block_size, dflash.sets) == ([4, 8], 6, ["a"])  # the flat copies
        eagle = store.get("eagle")
        assert eagle.spec.family_options == Eagle3Options(
            steps=3, eagle_trees=["4,3,16"], layer_convention="layer_input"
        )
        report = EvalReport.model_validate_json(store.report("eagle"))
        assert report.drafting == Eagle3Drafting(steps=3, draft_vocab_size=64, eagle_trees=["4,3,16"])
        mixed = store.get("mixed")
        assert (mixed.status, mixed.attempts, mixed.spec) == (JobStatus.failed, 0, EvalSpec())
        assert mixed.error is not None and "belong to different drafter families (dflash, eagle3)" in mixed.error
        assert (store.get("mixed-failed").status, store.get("mixed-failed").error) == (JobStatus.failed, "gave up")
        claimed = store.claim("w", 60)
        assert claimed is not None and claimed.job.job_id == "dflash" and claimed.job.spec == dflash.spec
        assert store.claim("w", 60) is None
        new = store.submit(JobSubmit(checkpoint="/r/b.pt", steps=2), checkpoint_relative="b.pt")
        assert store.get(new.job_id).spec.family_options == Eagle3Options(steps=2)
    finally:
        store.close()
