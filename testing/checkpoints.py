"""Write drafter checkpoints in the layouts the loader reads (for tests, the demo and the benches)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eval_worker.families.dflash.config import HfLayout
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.checkpoint_layout import HF_CONFIG, HF_WEIGHTS, TRAINER_STATE


def engine_keys(target_config: Any) -> dict[str, Any]:
    """The config keys vLLM needs in a DFlash drafter's config beyond the published layout's, for a target
    (a HF config)."""
    return {
        "vocab_size": target_config.vocab_size,
        "max_position_embeddings": target_config.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def save_hf_checkpoint(
    out_dir: Path,
    drafter: DFlashDrafter,
    *,
    layout: HfLayout = "published",
    extra: Mapping[str, Any] | None = None,
    global_step: int | None = None,
) -> Path:
    """Write `config.json` + `model.safetensors` in the published DFlash layout; `extra` config keys too
    (`engine_keys` for vLLM); with `global_step`, a `trainer_state.json` naming it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, out_dir / HF_WEIGHTS)
    (out_dir / HF_CONFIG).write_text(json.dumps({**drafter.cfg.to_hf_dict(layout), **(extra or {})}, indent=2))
    if global_step is not None:
        (out_dir / TRAINER_STATE).write_text(json.dumps({"global_step": global_step, "epoch": 0}))
    return out_dir


def save_torch_checkpoint(
    path: Path, drafter: DFlashDrafter, *, global_step: int, epoch: int, include_config: bool = True
) -> Path:
    """Write a training-style `torch.save` dict (the HF config dict embedded unless told not to)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    obj: dict[str, Any] = {
        "model_state_dict": {k: v.detach().cpu() for k, v in drafter.state_dict().items()},
        "global_step": global_step,
        "epoch": epoch,
    }
    if include_config:
        obj["config"] = drafter.cfg.to_hf_dict()
    torch.save(obj, path)
    return path
