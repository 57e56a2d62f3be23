"""The coordination database's driver comes with the `[postgres]` extra only, and a Postgres URL
without it says which extra to install."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from cache_server.coordination.database import Database

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_the_postgres_driver_is_its_own_extra() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert not any(r.startswith("psycopg") for r in extras["server"])
    assert extras["postgres"] == ["psycopg[binary]>=3.2"]


def test_a_postgres_url_without_its_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without [postgres] has: no psycopg
    with pytest.raises(ValueError, match=r"pip install 'hidden-state-cache\[postgres\]'"):
        Database("postgresql://user@127.0.0.1:1/db")
