"""Shared fixtures: a tiny random Qwen3 target built once per test session, an S3 endpoint and a
Postgres server on loopback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_server.capture.tiny_model import build_tiny_model
from testing.postgres import fresh_database, postgres_bin, postgres_server
from testing.s3 import aws_environment, fresh_prefix, moto_server


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target"), layers=6, hidden=64, vocab=512, seed=0)


@pytest.fixture(scope="session")
def other_tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights: must never read the first target's states."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target-2"), layers=6, hidden=64, vocab=512, seed=1)


@pytest.fixture(scope="session")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A moto S3 server on loopback for the whole session, its AWS_* variables set in os.environ."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("moto[server] is not installed (pip install -e '.[dev]'); CI runs these tests")
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as env, aws_environment(env):
        yield env


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store location on each backend: a directory, and a fresh prefix in the moto bucket."""
    if request.param == "local":
        return str(tmp_path / "store")
    request.getfixturevalue("s3_env")
    return fresh_prefix()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A Postgres server on loopback for the whole session (Debian's package; CI installs it)."""
    if postgres_bin() is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Postgres (apt-get install postgresql)")
        pytest.skip("Postgres is not installed (apt-get install postgresql); CI runs these tests")
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A coordination database on each engine: a SQLite file, and a fresh Postgres database."""
    if request.param == "sqlite":
        return str(tmp_path / "coordination.sqlite")
    return fresh_database(request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}")
