"""A server's defaults: the coordination database next to a local store, under its name or the one an
older server gave it."""

from __future__ import annotations

from pathlib import Path

import torch

from cache_server.compute.instances import DEFAULT_DB_FILE, OLD_DB_FILE, default_db_location
from cache_server.coordination.database import Database
from cache_server.store.hidden_store import HiddenStore


def _store(root: Path) -> HiddenStore:
    return HiddenStore(root, fingerprint="fp", model_name="m", hidden_size=8, dtype=torch.float32)


def test_a_new_store_gets_coordination_sqlite_and_an_older_one_keeps_jobs_sqlite(tmp_path: Path) -> None:
    with _store(tmp_path / "new") as new:
        assert default_db_location(new) == str(tmp_path / "new" / DEFAULT_DB_FILE)
    Database(str(tmp_path / "old" / OLD_DB_FILE)).close()  # what an older server left
    with _store(tmp_path / "old") as old:
        assert default_db_location(old) == str(tmp_path / "old" / OLD_DB_FILE)
    Database(str(tmp_path / "old" / DEFAULT_DB_FILE)).close()  # both: the new name wins
    with _store(tmp_path / "old") as old:
        assert default_db_location(old) == str(tmp_path / "old" / DEFAULT_DB_FILE)
