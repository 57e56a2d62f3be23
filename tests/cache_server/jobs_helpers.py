"""Small helpers for the job tests: a valid report body and a checkpoint root with traps in it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from schemas.jobs import JobSubmit


def report_body(worker: str = "w", checkpoint: str = "ckpt") -> dict[str, Any]:
    """The smallest valid `EvalReport` (no prompts); `target_name` carries who wrote it."""
    empty = {
        "mean_tau": None,
        "tokens_per_round": None,
        "total_tokens": 0,
        "total_rounds": 0,
        "histogram": {},
        "prompts_evaluated": 0,
        "prompts_without_rounds": 0,
    }
    return {
        "checkpoint_path": checkpoint,
        "format": "hf_dir",
        "step": None,
        "epoch": None,
        "target_name": worker,
        "target_fingerprint": "f" * 16,
        "target_layer_ids": [1, 3],
        "layer_ids_source": "checkpoint",
        "block_size": 4,
        "mask_token_id": 0,
        "tree_budgets": [],
        "device": "cpu",
        "dtype": "float32",
        "prompts": [],
        "summary": {
            "chain": empty,
            "trees": {},
            "prompts_evaluated": 0,
            "prompts_not_target_greedy": 0,
            "wall_time_s": 0.0,
        },
    }


def spec(checkpoint: str = "/ckpt/a", **kw: Any) -> JobSubmit:
    return JobSubmit(checkpoint=checkpoint, **kw)


def write_hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    return path


def checkpoint_tree(tmp: Path) -> tuple[Path, Path]:
    """`root/` with good checkpoints and traps, and `outside/` beside it holding real checkpoints.

    root/hf/                 config.json + model.safetensors
    root/runs/step100.pt     torch.save archive
    root/notes.txt           text, not a checkpoint
    root/half/               config.json only
    root/escape.pt ->        outside/stolen.pt
    root/linked/             config.json + model.safetensors -> outside/hf/model.safetensors
    root/inner.pt ->         runs/step100.pt (a symlink that stays inside: fine)
    """
    root, outside = tmp / "root", tmp / "outside"
    write_hf_dir(root / "hf")
    (root / "runs").mkdir()
    torch.save({"model_state_dict": {"w": torch.zeros(2)}}, root / "runs" / "step100.pt")
    (root / "notes.txt").write_text("not a checkpoint\n")
    (root / "half").mkdir()
    (root / "half" / "config.json").write_text("{}")
    write_hf_dir(outside / "hf")
    torch.save({"model_state_dict": {}}, outside / "stolen.pt")
    os.symlink(outside / "stolen.pt", root / "escape.pt")
    (root / "linked").mkdir()
    (root / "linked" / "config.json").write_text("{}")
    os.symlink(outside / "hf" / "model.safetensors", root / "linked" / "model.safetensors")
    os.symlink(root / "runs" / "step100.pt", root / "inner.pt")
    return root, outside
