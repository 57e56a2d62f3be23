"""Load DFlash drafters strictly: every config key honoured, named inert or refused (`layout.py`), the fc
width against the layer ids, every tensor's name and shape against the drafter built for them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eval_worker.checkpoints.config_keys import inert_lines
from eval_worker.checkpoints.layer_ids import default_layer_ids, resolve_layer_ids
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest, requested_options
from eval_worker.checkpoints.raw import RawCheckpoint
from eval_worker.checkpoints.state_checks import check_key_set, check_shapes, module_shapes
from eval_worker.errors import CheckpointRefused
from eval_worker.families.dflash.config import DFlashConfig
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.layout import read_dflash_config
from schemas.eval_spec import DFlashOptions
from schemas.model import ModelInfo

log = logging.getLogger(__name__)


def is_dflash(config: Mapping[str, Any]) -> bool:
    """Whether a config says it is a DFlash drafter's: a DFlash architecture (`DFlashDraftModel`, as every
    DFlash trainer writes it) or a `dflash_config` block (its keys are then checked one by one)."""
    archs = [str(a).lower() for a in config.get("architectures") or []]
    return any("dflash" in a for a in archs) or "dflash_config" in config


def expected_shapes(cfg: DFlashConfig, num_taps: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a DFlash drafter with `num_taps` taps, in state-dict order (11 * layers + 3)."""
    return module_shapes(lambda: DFlashDrafter(cfg, num_taps))


def load_dflash(path: Path, raw: RawCheckpoint, target: ModelInfo, request: LoadRequest) -> LoadedCheckpoint:
    """The DFlash drafter `raw` holds, fitting `target`, or CheckpointRefused."""
    options = requested_options(request, DFlashOptions)
    cfg, accepted = read_dflash_config(
        raw.config,
        block_size=options.block_size,
        mask_token_id=options.mask_token_id,
        inert=request.inert_config_keys,
    )
    _check_target_fit(cfg, target)
    check_key_set(raw.state, expected_shapes(cfg, 1))
    layer_ids = resolve_layer_ids(
        checkpoint_ids=cfg.target_layer_ids,
        override=request.layer_ids,
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
    for warning in accepted.warnings:
        log.warning("%s: %s", path, warning)
    log.info(
        "loaded %s checkpoint %s (step %s): target_layer_ids %s from %s, block_size %d",
        raw.format,
        path,
        raw.step,
        list(layer_ids.ids),
        layer_ids.source,
        cfg.block_size,
    )
    return LoadedCheckpoint(
        path,
        raw.format,
        "dflash",
        "dflash",
        cfg,
        drafter,
        layer_ids,
        raw.step,
        raw.epoch,
        cfg.hidden_size,
        options=options,
        inert_config_keys=accepted.inert,
        warnings=accepted.warnings,
    )


def check_dflash_fits(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """CheckpointRefused unless the loaded drafter fits `target`."""
    assert isinstance(checkpoint.config, DFlashConfig)
    _check_target_fit(checkpoint.config, target)


def describe_dflash(path: Path, raw: RawCheckpoint, request: LoadRequest) -> list[str]:
    """What `eval-worker inspect` says of a DFlash checkpoint, before any target is involved."""
    # the config as written (its own block size), with the request's stand-in mask token and inert keys
    cfg, accepted = read_dflash_config(
        raw.config,
        mask_token_id=requested_options(request, DFlashOptions).mask_token_id,
        inert=request.inert_config_keys,
    )
    fc = raw.state.get("fc.weight")
    fc_shape = list(fc.shape) if fc is not None else None
    taps = fc_shape[1] // cfg.hidden_size if fc_shape and fc_shape[1] % cfg.hidden_size == 0 else None
    if cfg.target_layer_ids is not None:
        layers = f"{list(cfg.target_layer_ids)} (from the checkpoint)"
    elif taps is not None and cfg.num_target_layers is not None:
        ids = default_layer_ids(cfg.num_target_layers, taps)
        layers = f"{ids} (inferred with the DFlash formula: {taps} taps of {cfg.num_target_layers} layers)"
    else:
        layers = (
            f"not in the checkpoint: inferred at evaluation from fc width ({taps} taps) with the DFlash "
            "formula and the target's layer count"
        )
    lines = [
        f"checkpoint         {path}",
        f"format             {raw.format}",
        "family             DFlash",
        f"step / epoch       {raw.step} / {raw.epoch}",
        f"drafter            {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads "
        f"({cfg.num_key_value_heads} kv) x {cfg.head_dim}, intermediate {cfg.intermediate_size}",
        f"tensors            {len(raw.state)}",
        f"block size         {cfg.block_size}",
        f"mask token         {cfg.mask_token_id}",
        f"target layers      {cfg.num_target_layers if cfg.num_target_layers is not None else '?'} in the target",
        f"target_layer_ids   {layers}",
        f"fc                 in_features {fc_shape[1] if fc_shape else '?'}, out_features "
        f"{fc_shape[0] if fc_shape else '?'} ({taps} taps x {cfg.hidden_size})",
    ]
    return lines + inert_lines(accepted)


def _check_target_fit(cfg: DFlashConfig, target: ModelInfo) -> None:
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
