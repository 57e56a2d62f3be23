"""The files a serving engine's hidden-states connector writes, one per request: read once its writer
lets go of the lock, checked against the request, then deleted (the engine never deletes them). A
file that is not there once the lock is free was never written (the engine died after answering, or
its writer failed): CaptureFileMissing, the engine's failure; one that is there but wrong is the
prompt's (CaptureFileError).

A file holds `hidden_states [T, n_aux, H]` (the engine's dtype), `token_ids [T]` and, written by the
project's connector (`cache_server/engine_connector`), `__metadata__` naming the aux layer ids (HF
`hidden_states` indices: this project's layer k is aux id k + 1), the dtype and the parallel sizes."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError, safe_open

from schemas.dtypes import DTYPE_NAMES, DTypeName
from schemas.prompts import CaptureInfo

FILE_FORMAT = "hsc-engine-capture/1"


class CaptureFileError(Exception):
    """The file the engine wrote for one sequence is unreadable or not that sequence's: its prompt fails."""


class CaptureFileMissing(CaptureFileError):
    """No file where the engine's answer said: it was never written (the engine died first, or its writer failed)."""


@dataclass(frozen=True)
class EngineLaunch:
    """What a capture file says of the engine that wrote it: its aux layer ids, dtype, parallel sizes."""

    aux_layer_ids: tuple[int, ...]
    dtype: DTypeName
    tensor_parallel_size: int
    pipeline_parallel_size: int
    version: str

    @classmethod
    def from_metadata(cls, metadata: dict[str, str] | None, path: Path) -> EngineLaunch:
        """Read from a file's `__metadata__`; CaptureFileError for a file the project's connector did not write."""
        if not metadata or metadata.get("format") != FILE_FORMAT:
            raise CaptureFileError(
                f"{path} does not say how it was computed (format {FILE_FORMAT!r}): launch the engine with the "
                "project's connector (kv_connector HiddenStatesConnector, module hsc_vllm_connector)"
            )
        if metadata.get("dtype") not in DTYPE_NAMES:
            raise CaptureFileError(f"{path}: hidden states in {metadata.get('dtype')}, which no store keeps")
        try:
            return cls(
                aux_layer_ids=tuple(int(i) for i in json.loads(metadata["aux_layer_ids"])),
                dtype=cast(DTypeName, metadata["dtype"]),
                tensor_parallel_size=int(metadata["tensor_parallel_size"]),
                pipeline_parallel_size=int(metadata["pipeline_parallel_size"]),
                version=metadata["vllm_version"],
            )
        except (KeyError, ValueError) as e:
            raise CaptureFileError(f"{path}: unreadable capture metadata ({type(e).__name__}: {e})") from None

    @property
    def layers(self) -> tuple[int, ...]:
        """The aux ids as this project's layer ids (aux id k + 1 is layer k), in the file's order."""
        return tuple(j - 1 for j in self.aux_layer_ids)

    @property
    def capture(self) -> CaptureInfo:
        """How the states were computed, as stored and hashed into the namespace."""
        return CaptureInfo(
            kind="engine",
            dtype=self.dtype,
            version=self.version,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
        )


def written_file(answer: object, files: Path) -> Path | None:
    """The file the engine's connector wrote for a completions answer, under `files` (the engine's
    directory as this server mounts it); None when the answer names none."""
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    written = params.get("hidden_states_path") if isinstance(params, dict) else None
    return files / os.path.basename(written) if isinstance(written, str) else None


def discard_capture_file(path: Path) -> None:
    """Delete a file no capture wants (a generation's, on an engine that captures every request),
    once its writer is done with it: deleted earlier, the writer would write it again after."""
    try:
        with _unlocked(path):
            path.unlink(missing_ok=True)
    except FileNotFoundError:  # no lock: nothing is being written
        path.unlink(missing_ok=True)
    Path(f"{path}.lock").unlink(missing_ok=True)


def take_capture_file(path: Path, token_ids: list[int], hidden_size: int) -> tuple[EngineLaunch, torch.Tensor]:
    """The launch and `hidden_states [T, n_aux, H]` of the file at `path`, checked (token ids equal
    the request's, shapes, every value finite) and deleted with its lock whatever the outcome."""
    try:
        return _read_checked(path, token_ids, hidden_size)
    finally:
        for leftover in (path, Path(f"{path}.lock")):
            leftover.unlink(missing_ok=True)


def sweep_capture_files(files: Path, older_than_s: float) -> int:
    """Delete the capture files (and locks) in `files` last written more than `older_than_s` ago: files
    no capture took (its server died between the prefill and the read, or the engine wrote a request
    the server never saw answered). Younger files may be another server's capture in progress."""
    cutoff, removed = time.time() - older_than_s, 0
    for path in files.glob("*.safetensors*"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # taken by its reader meanwhile
            continue
    return removed


def _read_checked(path: Path, token_ids: list[int], hidden_size: int) -> tuple[EngineLaunch, torch.Tensor]:
    try:
        with _unlocked(path), safe_open(path, framework="pt") as f:
            launch = EngineLaunch.from_metadata(f.metadata(), path)
            hidden, ids = f.get_tensor("hidden_states"), f.get_tensor("token_ids")
    except (OSError, SafetensorError) as e:
        if not path.exists():  # the writer let go of the lock (or never took it) without writing
            raise CaptureFileMissing(
                f"the engine answered, but wrote no capture file {path}: it died before writing it (or its "
                "writer failed: see its log), or --engine-files is not the directory its connector writes"
            ) from None
        raise CaptureFileError(f"the engine's capture file {path} could not be read: {e}") from None
    if ids.tolist() != token_ids:
        raise CaptureFileError(
            f"the engine's capture file {path} holds other token ids than the request's "
            f"({ids.numel()} tokens, first difference at {_first_difference(ids.tolist(), token_ids)})"
        )
    want = (len(token_ids), len(launch.aux_layer_ids), hidden_size)
    if tuple(hidden.shape) != want or str(hidden.dtype).removeprefix("torch.") != launch.dtype:
        raise CaptureFileError(
            f"{path}: hidden_states {tuple(hidden.shape)} {hidden.dtype}, expected {want} {launch.dtype}"
        )
    if not bool(torch.isfinite(hidden).all()):
        raise CaptureFileError(f"{path}: hidden_states hold non-finite values")
    return launch, hidden


@contextmanager
def _unlocked(path: Path, wait_s: float = 5.0) -> Iterator[None]:
    """Waits (shared flock on `<path>.lock`) until the engine's writer has released the file; the lock
    file appears before the response does, but give a shared filesystem a moment to show it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(f"{path}.lock", os.O_RDONLY)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
