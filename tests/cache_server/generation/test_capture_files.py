"""A capture file is read only once its writer lets go, checked against the request, and deleted
whatever the outcome; a file that is not the request's fails with the reason, and one that is not
there at all says the engine never wrote it."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cache_server.generation.capture_files import (
    FILE_FORMAT,
    CaptureFileError,
    CaptureFileMissing,
    sweep_capture_files,
    take_capture_file,
)

TOKENS = [5, 6, 7, 8]
HIDDEN = 16
METADATA = {
    "format": FILE_FORMAT,
    "aux_layer_ids": json.dumps([1, 3, 4]),
    "dtype": "float32",
    "tensor_parallel_size": "1",
    "pipeline_parallel_size": "1",
    "vllm_version": "0.32.0",
    "model": "tiny",
}


def _write(path: Path, hidden: torch.Tensor, tokens: list[int], metadata: dict[str, str] | None = METADATA) -> Path:
    save_file({"hidden_states": hidden, "token_ids": torch.tensor(tokens)}, path, metadata=metadata)
    Path(f"{path}.lock").touch()
    return path


def test_a_file_is_read_converted_and_deleted(tmp_path: Path) -> None:
    hidden = torch.randn(len(TOKENS), 3, HIDDEN)
    path = _write(tmp_path / "r-0.safetensors", hidden, TOKENS)
    launch, read = take_capture_file(path, TOKENS, HIDDEN)
    assert torch.equal(read, hidden)
    assert launch.layers == (0, 2, 3) and launch.capture.describe() == "engine vllm 0.32.0 float32 tp 1 pp 1"
    assert not path.exists() and not Path(f"{path}.lock").exists()


def test_the_reader_waits_for_the_writers_lock(tmp_path: Path) -> None:
    path = tmp_path / "r-1.safetensors"
    lock = os.open(f"{path}.lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the engine holds it until the file is whole

    def write_then_release() -> None:
        time.sleep(0.3)
        save_file(
            {"hidden_states": torch.ones(4, 3, HIDDEN), "token_ids": torch.tensor(TOKENS)}, path, metadata=METADATA
        )
        os.close(lock)

    writer = threading.Thread(target=write_then_release)
    writer.start()
    _, read = take_capture_file(path, TOKENS, HIDDEN)
    writer.join()
    assert torch.equal(read, torch.ones(4, 3, HIDDEN))


@pytest.mark.parametrize(
    ("tokens", "hidden", "metadata", "reason"),
    [
        (
            [5, 6, 7, 9],
            torch.zeros(4, 3, HIDDEN),
            METADATA,
            "other token ids than the request's .* first difference at 3",
        ),
        (
            TOKENS,
            torch.zeros(4, 2, HIDDEN),
            METADATA,
            r"hidden_states \(4, 2, 16\) torch.float32, expected \(4, 3, 16\)",
        ),
        (TOKENS, torch.full((4, 3, HIDDEN), float("nan")), METADATA, "non-finite"),
        (TOKENS, torch.zeros(4, 3, HIDDEN), None, "does not say how it was computed"),
        (TOKENS, torch.zeros(4, 3, HIDDEN, dtype=torch.bfloat16), METADATA, "expected .* float32"),
    ],
)
def test_a_file_that_is_not_the_requests_fails_with_the_reason(
    tmp_path: Path, tokens: list[int], hidden: torch.Tensor, metadata: dict[str, str] | None, reason: str
) -> None:
    path = _write(tmp_path / "r-2.safetensors", hidden, tokens, metadata)
    with pytest.raises(CaptureFileError, match=reason):
        take_capture_file(path, TOKENS, HIDDEN)
    assert not path.exists() and not Path(f"{path}.lock").exists()


def test_a_truncated_file_is_the_prompts_error_a_missing_one_the_engines(tmp_path: Path) -> None:
    path = _write(tmp_path / "r-3.safetensors", torch.zeros(4, 3, HIDDEN), TOKENS)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CaptureFileError, match="could not be read") as truncated:
        take_capture_file(path, TOKENS, HIDDEN)
    assert not isinstance(truncated.value, CaptureFileMissing)
    Path(f"{path}.lock").touch()
    with pytest.raises(CaptureFileMissing, match="the engine answered, but wrote no capture file"):
        take_capture_file(path, TOKENS, HIDDEN)  # no file at all beside its lock: its writer died first
    assert not Path(f"{path}.lock").exists()


def test_files_no_capture_took_are_swept_once_older_than_the_lease(tmp_path: Path) -> None:
    old = _write(tmp_path / "old.safetensors", torch.zeros(4, 3, HIDDEN), TOKENS)
    young = _write(tmp_path / "young.safetensors", torch.zeros(4, 3, HIDDEN), TOKENS)
    long_ago = time.time() - 120
    for path in (old, Path(f"{old}.lock")):
        os.utime(path, (long_ago, long_ago))
    assert sweep_capture_files(tmp_path, older_than_s=60) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["young.safetensors", "young.safetensors.lock"]
    assert young.exists()
