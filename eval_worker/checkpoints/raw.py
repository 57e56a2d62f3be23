"""A checkpoint's tensors and config as read from disk, before any check against a target.

Two formats: a HF directory (`config.json` + `model.safetensors`, its shards through
`model.safetensors.index.json`, or `pytorch_model.bin`; no remote code; its step from a
`trainer_state.json` beside them) and a `torch.save` dict `{"model_state_dict", "global_step",
"epoch", "config"?}`, both read with `weights_only=True`. Safetensors are read tensor by tensor as a
loader asks for them: a target directory holding MTP heads is opened for those alone.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from eval_worker.errors import CheckpointRefused
from schemas.checkpoint_layout import HF_BIN_WEIGHTS, HF_CONFIG, HF_WEIGHTS, HF_WEIGHTS_INDEX, TRAINER_STATE

CheckpointFormat = Literal["hf_dir", "torch_dict"]


@dataclass(frozen=True)
class RawCheckpoint:
    """A checkpoint's tensors and config as read, before any check against a target."""

    format: CheckpointFormat
    state: Mapping[str, Tensor]
    config: dict[str, Any]
    step: int | None
    epoch: int | None


def read_raw(path: Path, config_path: Path | None = None) -> RawCheckpoint:
    """Tensors and config of a HF dir or a torch.save file, unchecked (for `inspect`)."""
    if not path.exists():
        raise CheckpointRefused(f"checkpoint {path} does not exist")
    return _read_hf_dir(path, config_path) if path.is_dir() else _read_torch_dict(path, config_path)


class SafetensorsState(Mapping[str, Tensor]):
    """Tensors of safetensors files by name, each read from its file when first asked for."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self._files = dict(files)  # tensor name -> the file holding it
        self._read: dict[str, Tensor] = {}

    @classmethod
    def open(cls, paths: list[Path]) -> SafetensorsState:
        """The tensors of these files (CheckpointRefused: unreadable, or a name in two of them)."""
        files: dict[str, Path] = {}
        for path in paths:
            for name in _names(path):
                if name in files:
                    raise CheckpointRefused(f"tensor {name} is in both {files[name]} and {path}")
                files[name] = path
        return cls(files)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._read:
            with safe_open(self._files[name], framework="pt") as f:
                self._read[name] = f.get_tensor(name)
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _names(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError) as exc:
        raise CheckpointRefused(f"{path} is not a readable safetensors file: {exc}") from exc


def _shards(index: Path) -> list[Path]:
    """The shard files a safetensors index names, each once, in the index's order."""
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointRefused(f"{index} has no weight_map of tensor names to shard files")
    return [index.parent / name for name in dict.fromkeys(weight_map.values())]


def _read_hf_dir(path: Path, config_path: Path | None) -> RawCheckpoint:
    weights, index, legacy = path / HF_WEIGHTS, path / HF_WEIGHTS_INDEX, path / HF_BIN_WEIGHTS
    state: Mapping[str, Tensor]
    if weights.is_file():
        state = SafetensorsState.open([weights])
    elif index.is_file():
        state = SafetensorsState.open(_shards(index))
    elif legacy.is_file():
        state = _tensors(_torch_load(legacy), legacy)
    else:
        raise CheckpointRefused(f"{path} has none of {HF_WEIGHTS}, {HF_WEIGHTS_INDEX} and {HF_BIN_WEIGHTS}")
    step, epoch = _trainer_state(path / TRAINER_STATE)
    return RawCheckpoint("hf_dir", state, _read_json(config_path or path / HF_CONFIG), step, epoch)


def _trainer_state(path: Path) -> tuple[int | None, int | None]:
    """A HF directory's training step (and whole epoch) from the `trainer_state.json` trainers write beside it."""
    if not path.is_file():
        return None, None
    state = _read_json(path)
    step, epoch = state.get("global_step"), state.get("epoch")
    if not isinstance(step, int) or isinstance(step, bool):
        raise CheckpointRefused(f"{path}: global_step must be an integer, got {step!r}")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool) and float(epoch).is_integer():
        return step, int(epoch)
    return step, None  # HF trainers write fractional epochs


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        raise CheckpointRefused(f"{path} does not load with torch.load(weights_only=True): {exc}") from exc


def _tensors(state: Any, path: Path) -> dict[str, Tensor]:
    if not isinstance(state, Mapping):
        raise CheckpointRefused(f"{path} does not hold a mapping of tensors")
    not_tensors = [k for k, v in state.items() if not isinstance(v, Tensor)]
    if not_tensors:
        raise CheckpointRefused(f"{path}: entries {not_tensors} are not tensors")
    return dict(state)


def _read_torch_dict(path: Path, config_path: Path | None) -> RawCheckpoint:
    obj = _torch_load(path)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("model_state_dict"), Mapping):
        raise CheckpointRefused(f"{path} is not a dict with a 'model_state_dict' mapping")
    state = _tensors(obj["model_state_dict"], path)
    if config_path is not None:
        config = _read_json(config_path)
    elif isinstance(obj.get("config"), Mapping):
        config = dict(obj["config"])
    else:
        raise CheckpointRefused(f"{path} carries no 'config' dict; pass the drafter's config.json path with --config")
    step, epoch = obj.get("global_step"), obj.get("epoch")
    return RawCheckpoint(
        "torch_dict",
        state,
        config,
        int(step) if step is not None else None,
        int(epoch) if epoch is not None else None,
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointRefused(f"cannot read drafter config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointRefused(f"drafter config {path} is not a JSON object")
    return data
