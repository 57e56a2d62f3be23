"""Load drafter checkpoints (DFlash or EAGLE-3, told apart by their config) - strictly, or not at all.

Two formats: a HF directory (`config.json` + `model.safetensors` or `pytorch_model.bin`, no remote
code; its step from a `trainer_state.json` beside them) and a `torch.save` dict `{"model_state_dict",
"global_step", "epoch", "config"?}`, both read with `weights_only=True`. Anything that would not load
with `strict=True` into a drafter fitting the target raises `CheckpointRefused` naming the tensor, the
shapes and the layer ids.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from eval_worker.checkpoints.dflash_layout import read_dflash_config
from eval_worker.checkpoints.eagle3_layouts import is_eagle3, read_layout
from eval_worker.checkpoints.eagle3_loading import load_eagle3
from eval_worker.checkpoints.layer_ids import LayerConvention, LayerIdsSource, ResolvedLayerIds, resolve_layer_ids
from eval_worker.checkpoints.state_checks import check_key_set, check_shapes, module_shapes
from eval_worker.drafters.config import DrafterConfig
from eval_worker.drafters.eagle3 import Eagle3Drafter
from eval_worker.drafters.eagle3_config import Eagle3Config
from eval_worker.drafters.model import DFlashDrafter
from eval_worker.errors import CheckpointRefused
from schemas.checkpoint_layout import HF_BIN_WEIGHTS, HF_CONFIG, HF_WEIGHTS, TRAINER_STATE
from schemas.layers import layer_list_problem
from schemas.model import ModelInfo

log = logging.getLogger(__name__)

CheckpointFormat = Literal["hf_dir", "torch_dict"]
Family = Literal["dflash", "eagle3"]


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A drafter loaded strictly for a target, with its family, layout and where its layer ids came from."""

    path: Path
    format: CheckpointFormat
    family: Family
    layout: str  # "dflash", or the EAGLE-3 layout: "eagle" | "specforge" | "speculators"
    config: DrafterConfig | Eagle3Config
    drafter: DFlashDrafter | Eagle3Drafter
    layer_ids: ResolvedLayerIds
    step: int | None
    epoch: int | None

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """The target layers fetched, as the cache serves them (0-based decoder outputs)."""
        return self.layer_ids.ids

    @property
    def layer_ids_source(self) -> LayerIdsSource:
        """Where those ids came from."""
        return self.layer_ids.source

    @property
    def tap_width(self) -> int:
        """Width of one target layer's features as the drafter reads them (the target's hidden size)."""
        cfg = self.config
        return cfg.target_hidden_size if isinstance(cfg, Eagle3Config) else cfg.hidden_size


@dataclass(frozen=True)
class RawCheckpoint:
    """A checkpoint's tensors and config as read, before any check against a target."""

    format: CheckpointFormat
    state: dict[str, Tensor]
    config: dict[str, Any]
    step: int | None
    epoch: int | None


def expected_shapes(cfg: DrafterConfig, num_taps: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a DFlash drafter with `num_taps` taps, in state-dict order (11 * layers + 3)."""
    return module_shapes(lambda: DFlashDrafter(cfg, num_taps))


def load_checkpoint(
    path: Path,
    target: ModelInfo,
    *,
    config_path: Path | None = None,
    layer_ids_override: Sequence[int] | None = None,
    block_size_override: int | None = None,
    layer_convention: LayerConvention | None = None,
    mask_token_id: int | None = None,
) -> LoadedCheckpoint:
    """A drafter that fits `target`, loaded strictly from `path` (a HF dir or a torch.save file).

    `layer_ids_override` (decoder outputs) is only for checkpoints that name no layers (one that
    contradicts them is refused); `block_size_override` drafts a different DFlash block length than
    the config's; `layer_convention` reads an EAGLE-3 checkpoint's ids in that convention;
    `mask_token_id` is for DFlash configs that name none."""
    raw = read_raw(path, config_path)
    if is_eagle3(raw.config):
        for flag, value in (("--block-size", block_size_override), ("--mask-token-id", mask_token_id)):
            if value is not None:
                raise CheckpointRefused(f"{path} is an EAGLE-3 drafter: {flag} applies to DFlash only")
        layout = read_layout(raw.config)
        loaded = load_eagle3(
            raw.state, layout, target,
            layer_ids_override=tuple(layer_ids_override) if layer_ids_override is not None else None,
            convention_override=layer_convention,
        )  # fmt: skip
        ids = loaded.layer_ids
        log.info(
            "loaded EAGLE-3 (%s layout) %s checkpoint %s (step %s): layer ids %s as %s (%s) = target layers %s (%s)",
            layout.layout, raw.format, path, raw.step, list(ids.checkpoint_ids or []), ids.convention,
            ids.convention_source, list(ids.ids), ids.source,
        )  # fmt: skip
        return LoadedCheckpoint(
            path, raw.format, "eagle3", layout.layout, layout.config, loaded.drafter, ids, raw.step, raw.epoch
        )
    if layer_convention is not None:
        raise CheckpointRefused(f"{path} is a DFlash drafter: its ids are decoder outputs; --layer-convention "
                                "applies to EAGLE-3 only")  # fmt: skip
    cfg = read_dflash_config(raw.config, block_size=block_size_override, mask_token_id=mask_token_id)
    _check_target_fit(cfg, target)
    check_key_set(raw.state, expected_shapes(cfg, 1))
    layer_ids = resolve_layer_ids(
        checkpoint_ids=cfg.target_layer_ids,
        override=layer_ids_override,
        fc_shape=tuple(raw.state["fc.weight"].shape),
        hidden_size=target.hidden_size,
        num_target_layers=target.num_layers,
    )
    check_shapes(raw.state, expected_shapes(cfg, len(layer_ids.ids)))
    drafter = DFlashDrafter(cfg, len(layer_ids.ids))
    try:
        drafter.load_state_dict(raw.state, strict=True)
    except RuntimeError as exc:  # unreachable after the checks above, but never continue on a bad load
        raise CheckpointRefused(f"{path}: load_state_dict(strict=True) failed: {exc}") from exc
    drafter.eval()
    log.info(
        "loaded %s checkpoint %s (step %s): target_layer_ids %s from %s, block_size %d",
        raw.format, path, raw.step, list(layer_ids.ids), layer_ids.source, cfg.block_size,
    )  # fmt: skip
    return LoadedCheckpoint(path, raw.format, "dflash", "dflash", cfg, drafter, layer_ids, raw.step, raw.epoch)


def read_raw(path: Path, config_path: Path | None = None) -> RawCheckpoint:
    """Tensors and config of a HF dir or a torch.save file, unchecked (for `inspect`)."""
    if not path.exists():
        raise CheckpointRefused(f"checkpoint {path} does not exist")
    return _read_hf_dir(path, config_path) if path.is_dir() else _read_torch_dict(path, config_path)


def _read_hf_dir(path: Path, config_path: Path | None) -> RawCheckpoint:
    weights, legacy = path / HF_WEIGHTS, path / HF_BIN_WEIGHTS
    if weights.is_file():
        try:
            state = load_file(weights)
        except SafetensorError as exc:
            raise CheckpointRefused(f"{weights} is not a readable safetensors file: {exc}") from exc
    elif legacy.is_file():
        state = _tensors(_torch_load(legacy), legacy)
    else:
        raise CheckpointRefused(f"{path} has neither {HF_WEIGHTS} nor {HF_BIN_WEIGHTS} (sharded checkpoints are "
                                "not supported)")  # fmt: skip
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
        raise CheckpointRefused(f"{path} carries no 'config' dict; pass the drafter's config.json path")
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


def check_fits_target(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """Re-check a loaded checkpoint against a (possibly different) target description."""
    cfg = checkpoint.config
    if isinstance(cfg, Eagle3Config):
        if (cfg.target_hidden_size, cfg.vocab_size) != (target.hidden_size, target.vocab_size):
            raise CheckpointRefused(
                f"EAGLE-3 drafter reads taps of width {cfg.target_hidden_size} over a vocab of {cfg.vocab_size}; "
                f"target {target.name!r} has {target.hidden_size} and {target.vocab_size}"
            )
    else:
        _check_target_fit(cfg, target)
    problem = layer_list_problem(checkpoint.target_layer_ids, target.num_layers)
    if problem is not None:
        raise CheckpointRefused(
            f"target_layer_ids {list(checkpoint.target_layer_ids)} for target {target.name!r}: {problem}"
        )


def _check_target_fit(cfg: DrafterConfig, target: ModelInfo) -> None:
    if cfg.hidden_size != target.hidden_size:
        raise CheckpointRefused(
            f"drafter hidden_size {cfg.hidden_size} != target {target.name!r} "
            f"hidden_size {target.hidden_size} "
            "(the drafter uses the target's embed_tokens and lm_head)"
        )
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise CheckpointRefused(
            f"mask_token_id {cfg.mask_token_id} is outside the target vocab [0, {target.vocab_size})"
        )
    if cfg.vocab_size is not None and cfg.vocab_size != target.vocab_size:
        raise CheckpointRefused(
            f"drafter was built for a vocab of {cfg.vocab_size}; target {target.name!r} has {target.vocab_size}"
        )
    if cfg.num_target_layers is not None and cfg.num_target_layers != target.num_layers:
        raise CheckpointRefused(
            f"drafter was built for a {cfg.num_target_layers}-layer target; target {target.name!r} "
            f"has {target.num_layers} layers"
        )
