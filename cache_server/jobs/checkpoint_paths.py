"""Where a submitted checkpoint may live: resolved inside the checkpoint root, and shaped like one; and
the drafter config a job may give beside a torch.save file, a file inside the same root.

Containment is checked on real paths (symlinks followed, `..` collapsed), so neither `../x` nor a
symlink inside the root that points out gets through. Only the outline is checked here; the worker
loads the checkpoint strictly and refuses it if its contents are wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cache_server.errors import InvalidCheckpointPath
from schemas.checkpoint_layout import HF_DIR_HOLDS, hf_files, is_torch_archive


@dataclass(frozen=True)
class CheckpointPath:
    """A checkpoint inside the root."""

    path: Path  # real, absolute, inside the root
    relative: Path  # relative to the root's real path


def _inside(real: Path, root: Path, given: str, what: str = "checkpoint") -> None:
    if not real.is_relative_to(root):
        raise InvalidCheckpointPath(
            f"{what} {given!r} resolves outside the checkpoint root {root} "
            "(paths are relative to the root; '..' and symlinks may not leave it)"
        )


def resolve_checkpoint(root: Path, given: str) -> CheckpointPath:
    """`given` (relative to `root`, or absolute) as a checkpoint inside `root`, or InvalidCheckpointPath."""
    if "\x00" in given or not given.strip():
        raise InvalidCheckpointPath(f"checkpoint path {given!r} is empty or holds a NUL byte")
    real_root = Path(os.path.realpath(root))
    try:
        real = Path(os.path.realpath(real_root / given))  # an absolute `given` replaces the root here
        _inside(real, real_root, given)
        if not real.exists():
            raise InvalidCheckpointPath(f"checkpoint {given!r} does not exist under {real_root}")
        if real.is_dir():
            _check_hf_dir(real, real_root, given)
        elif real.is_file():
            _check_torch_file(real, given)
        else:
            raise InvalidCheckpointPath(f"checkpoint {given!r} is neither a regular file nor a directory")
    except OSError as e:  # a name too long for the file system, a loop of symlinks, ...
        raise InvalidCheckpointPath(f"checkpoint path {given[:200]!r} cannot be resolved: {e.strerror}") from None
    return CheckpointPath(real, real.relative_to(real_root))


def resolve_config(root: Path, given: str) -> Path:
    """A job's drafter config (relative to `root`, or absolute) as a regular file inside `root`, real and
    absolute, or InvalidCheckpointPath; the worker reads and checks its contents."""
    if "\x00" in given or not given.strip():
        raise InvalidCheckpointPath(f"config path {given!r} is empty or holds a NUL byte")
    real_root = Path(os.path.realpath(root))
    try:
        real = Path(os.path.realpath(real_root / given))
        _inside(real, real_root, given, "config")
        if not real.is_file():
            raise InvalidCheckpointPath(f"config {given!r} is not a file under {real_root}")
    except OSError as e:
        raise InvalidCheckpointPath(f"config path {given[:200]!r} cannot be resolved: {e.strerror}") from None
    return real


def _check_hf_dir(real: Path, root: Path, given: str) -> None:
    files = hf_files(real)
    if not files:
        raise InvalidCheckpointPath(
            f"checkpoint directory {given!r} is incomplete: a checkpoint directory holds {HF_DIR_HOLDS}"
        )
    for name in files:
        _inside(Path(os.path.realpath(real / name)), root, f"{given}/{name}")


def _check_torch_file(real: Path, given: str) -> None:
    try:
        is_zip = is_torch_archive(real)
    except OSError as e:
        raise InvalidCheckpointPath(f"checkpoint {given!r} cannot be read: {e.strerror}") from None
    if not is_zip:
        raise InvalidCheckpointPath(
            f"checkpoint file {given!r} is not a torch.save archive (torch.save writes a zip archive; "
            "legacy pickle files are not accepted); a checkpoint directory holds "
            f"{HF_DIR_HOLDS}"
        )
