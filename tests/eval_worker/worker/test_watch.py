"""Checkpoint discovery: only finished checkpoints, each once."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch

from eval_worker.worker.watch import CheckpointWatcher


def test_a_checkpoint_is_submitted_once_it_stops_changing(tmp_path: Path) -> None:
    watcher = CheckpointWatcher(tmp_path)
    torch.save({"model_state_dict": {}}, tmp_path / "step_100.pt")
    assert watcher.poll() == []  # first sight: maybe still being written
    assert watcher.poll() == [tmp_path / "step_100.pt"]
    assert watcher.poll() == []  # never twice


def test_a_half_written_file_is_not_submitted(tmp_path: Path) -> None:
    full = tmp_path / "full.pt"
    torch.save({"model_state_dict": {"w": torch.zeros(1000)}}, full)
    data = full.read_bytes()
    full.unlink()
    partial = tmp_path / "step_200.pt"
    partial.write_bytes(data[: len(data) // 2])  # a writer that stopped (or stalls) half way
    watcher = CheckpointWatcher(tmp_path)
    assert watcher.poll() == [] and watcher.poll() == []
    assert not zipfile.is_zipfile(partial)
    partial.write_bytes(data)  # the writer finishes
    assert watcher.poll() == []
    assert watcher.poll() == [partial]


def test_growing_file_waits_until_stable(tmp_path: Path) -> None:
    path = tmp_path / "step_300.pt"
    torch.save({"a": torch.zeros(10)}, path)
    watcher = CheckpointWatcher(tmp_path)
    watcher.poll()
    torch.save({"a": torch.zeros(20000)}, path)  # rewritten between two looks
    assert watcher.poll() == []
    assert watcher.poll() == [path]


def test_hf_directories_need_both_files(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "hf_step_10"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({}))
    watcher = CheckpointWatcher(tmp_path)
    assert watcher.poll() == [] and watcher.poll() == []
    (ckpt / "model.safetensors").write_bytes(b"x")
    watcher.poll()
    assert watcher.poll() == [ckpt]
