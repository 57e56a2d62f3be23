"""Checkpoint paths resolve inside the root, on real paths, and must look like a checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cache_server.errors import InvalidCheckpointPath
from cache_server.jobs.checkpoint_paths import resolve_checkpoint
from tests.cache_server.jobs_helpers import checkpoint_tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return checkpoint_tree(tmp_path_factory.mktemp("ckpts"))


@pytest.mark.parametrize(
    ("given", "kind", "relative"),
    [
        ("hf", "hf_dir", "hf"),
        ("hf/", "hf_dir", "hf"),
        ("runs/step100.pt", "torch_file", "runs/step100.pt"),
        ("runs/../runs/./step100.pt", "torch_file", "runs/step100.pt"),
        ("inner.pt", "torch_file", "runs/step100.pt"),
    ],
)
def test_checkpoints_inside_the_root(tree: tuple[Path, Path], given: str, kind: str, relative: str) -> None:
    root, _ = tree
    found = resolve_checkpoint(root, given)
    assert ("hf_dir" if found.path.is_dir() else "torch_file", found.relative.as_posix()) == (kind, relative)
    assert found.path == (root / relative).resolve() and found.path.is_absolute()


def test_an_absolute_path_inside_the_root_is_accepted(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    assert resolve_checkpoint(root, str(root / "hf")).relative.as_posix() == "hf"


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ("../outside/stolen.pt", "outside the checkpoint root"),
        ("hf/../../outside/hf", "outside the checkpoint root"),
        ("escape.pt", "outside the checkpoint root"),
        ("linked", "outside the checkpoint root"),
        ("missing.pt", "does not exist"),
        ("notes.txt", "not a torch.save archive"),
        ("half", "is incomplete: a checkpoint directory holds config.json"),
        ("", "empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_refused_paths(tree: tuple[Path, Path], given: str, needle: str) -> None:
    root, _ = tree
    with pytest.raises(InvalidCheckpointPath, match=needle):
        resolve_checkpoint(root, given)


def test_absolute_paths_elsewhere_are_refused(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    for given in (str(outside / "stolen.pt"), "/etc/passwd", str(root.parent)):
        with pytest.raises(InvalidCheckpointPath, match="outside the checkpoint root"):
            resolve_checkpoint(root, given)


def test_a_root_given_through_a_symlink_still_contains_its_files(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = tree
    (tmp_path / "alias").symlink_to(root)
    assert resolve_checkpoint(tmp_path / "alias", "runs/step100.pt").path == (root / "runs/step100.pt").resolve()


def test_a_fifo_is_refused_without_blocking(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = tree
    os.mkfifo(root / "pipe.pt")
    with pytest.raises(InvalidCheckpointPath, match="neither a regular file nor a directory"):
        resolve_checkpoint(root, "pipe.pt")
