"""Shared fixtures: a tiny random Qwen3 target, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_server.capture.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target"), layers=6, hidden=64, vocab=512, seed=0)


@pytest.fixture(scope="session")
def other_tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights: must never read the first target's states."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target-2"), layers=6, hidden=64, vocab=512, seed=1)
