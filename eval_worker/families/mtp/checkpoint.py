"""Load MTP heads strictly, from the target's own checkpoint (only the heads' tensors are read) or from
an MTP-only checkpoint (a directory with the target's config and the heads' tensors under their
published names, as a fine-tune writes them): the config read by transformers' own class for the
architecture (any key it does not know refused unless named inert), one head, every tensor's name and
shape against the head built for the target."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eval_worker.checkpoints.config_keys import INERT, KeysAccepted, check_keys, inert_lines
from eval_worker.checkpoints.layer_ids import ResolvedLayerIds
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest, requested_options
from eval_worker.checkpoints.raw import RawCheckpoint
from eval_worker.checkpoints.state_checks import check_key_set, check_shapes, module_shapes
from eval_worker.errors import CheckpointRefused
from eval_worker.families.mtp.drafter import MtpDrafter
from eval_worker.families.mtp.layouts import MtpLayout, layout_of
from schemas.eval_spec import MtpOptions
from schemas.model import ModelInfo

log = logging.getLogger(__name__)


def is_mtp(config: Mapping[str, Any]) -> bool:
    """Whether a config is a target's that declares MTP heads in a layout read here."""
    return layout_of(config) is not None


def read_mtp_config(raw: Mapping[str, Any], inert: frozenset[str]) -> tuple[MtpLayout, Any, KeysAccepted]:
    """The layout, the target config as transformers reads it, and the keys accepted as inert."""
    layout = layout_of(raw)
    if layout is None:  # family_of chose this family by the same test
        raise CheckpointRefused("the config declares no MTP heads in a layout read here")
    if "quantization_config" in raw:
        raise CheckpointRefused(
            "quantized MTP weights (quantization_config) are not read here: evaluate a dequantized checkpoint"
        )
    count = layout.head_count(raw)
    if count != 1:
        raise CheckpointRefused(
            f"the config declares {count} MTP heads: vLLM drafts every step with the first, and checkpoints "
            "with several are not evaluated here"
        )
    for key, value in layout.fixed:
        if key in raw and raw[key] != value:
            raise CheckpointRefused(f"{key} {raw[key]!r}: transformers' {layout.decoder_layer} computes {value!r} only")
    from transformers import AutoConfig  # the `mtp` extra: MTP heads are built from transformers' own classes

    cfg = AutoConfig.for_model(str(raw["model_type"]), **{k: v for k, v in raw.items() if k != "model_type"})
    known = set(type(cfg)().to_dict()) | INERT | set(layout.count_keys) | {k for k, _ in layout.fixed}
    accepted = check_keys(raw, known, f"{layout.name} MTP", inert)
    return layout, cfg, accepted


def expected_shapes(layout: MtpLayout, cfg: Any) -> dict[str, tuple[int, ...]]:
    """Every tensor of the head, as the drafter names them."""
    return module_shapes(lambda: MtpDrafter(layout, cfg))


def head_state(raw_state: Mapping[str, Tensor], layout: MtpLayout, cfg: Any) -> tuple[dict[str, Tensor], list[str]]:
    """The head's tensors under the drafter's names (experts stacked as transformers holds them), and
    the published copies vLLM does not read; CheckpointRefused for a key of the head's not placed."""
    num_layers = int(cfg.num_hidden_layers)
    prefix = layout.prefix(num_layers)
    state: dict[str, Tensor] = {}
    experts: dict[str, dict[int, Tensor]] = {}
    unread = []
    for key in (k for k in raw_state if k.startswith(prefix)):
        rest = key.removeprefix(prefix)
        if layout.unread and rest.startswith(layout.unread):
            unread.append(key)
            continue
        name = layout.drafter_key(key, num_layers)
        if name is None:
            raise CheckpointRefused(f"tensor {key} is not part of the first MTP head ({layout.name} layout)")
        parts = name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            at = parts.index("experts")  # block.mlp.experts.{e}.{gate,up,down}_proj.weight
            experts.setdefault(".".join([*parts[: at + 1], parts[at + 2]]), {})[int(parts[at + 1])] = raw_state[key]
        else:
            state[name] = raw_state[key]
    state.update(_stacked_experts(experts))
    return state, sorted(unread)


def _stacked_experts(experts: Mapping[str, Mapping[int, Tensor]]) -> dict[str, Tensor]:
    """Per-expert projections -> transformers' stacked `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]."""
    out: dict[str, Tensor] = {}
    for stem in {k.rsplit(".", 1)[0] for k in experts}:
        gate, up, down = (experts.get(f"{stem}.{p}_proj", {}) for p in ("gate", "up", "down"))
        ids = sorted(gate)
        if not ids or sorted(up) != ids or sorted(down) != ids or ids != list(range(len(ids))):
            raise CheckpointRefused(
                f"{stem}: experts need gate, up and down projections for ids 0..E-1, "
                f"got {sorted(gate)}, {sorted(up)}, {sorted(down)}"
            )
        out[f"{stem}.gate_up_proj"] = torch.stack([torch.cat([gate[e], up[e]]) for e in ids])
        out[f"{stem}.down_proj"] = torch.stack([down[e] for e in ids])
    return out


def load_mtp(path: Path, raw: RawCheckpoint, target: ModelInfo, request: LoadRequest) -> LoadedCheckpoint:
    """The first MTP head `raw` holds, fitting `target`, or CheckpointRefused."""
    options = requested_options(request, MtpOptions)
    layout, cfg, accepted = read_mtp_config(raw.config, request.inert_config_keys)
    _check_target_fit(cfg, target)
    last = target.num_layers - 1
    if request.layer_ids is not None and tuple(request.layer_ids) != (last,):
        raise CheckpointRefused(
            f"an MTP head reads the target's last layer ({last}), not layer ids {list(request.layer_ids)}"
        )
    state, unread = head_state(raw.state, layout, cfg)
    expected = expected_shapes(layout, cfg)
    check_key_set(state, expected)
    check_shapes(state, expected)
    drafter = MtpDrafter(layout, cfg)
    try:
        drafter.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # unreachable after the checks above, but never continue on a bad load
        raise CheckpointRefused(f"{path}: load_state_dict(strict=True) failed: {exc}") from exc
    drafter.eval()
    warnings = accepted.warnings
    if unread:
        warnings += (
            f"{unread} are not read: vLLM drafts MTP heads with the target's embedding and lm_head "
            "(/target/heads), as this evaluation does",
        )
    for warning in warnings:
        log.warning("%s: %s", path, warning)
    log.info("loaded %s MTP head from %s (step %s): reads layer %d", layout.name, path, raw.step, last)
    return LoadedCheckpoint(
        path,
        raw.format,
        "mtp",
        layout.name,
        cfg,
        drafter,
        ResolvedLayerIds((last,), "family"),
        raw.step,
        raw.epoch,
        int(cfg.hidden_size),
        options=options,
        inert_config_keys=accepted.inert,
        warnings=warnings,
    )


def _check_target_fit(cfg: Any, target: ModelInfo) -> None:
    """The head's config must be the target's: its layer count (where the heads sit), width and vocabulary."""
    ours = (int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size))
    theirs = (target.num_layers, target.hidden_size, target.vocab_size)
    if ours != theirs:
        raise CheckpointRefused(
            f"the MTP checkpoint's config (layers, hidden, vocab) {ours} is not the target's {theirs} "
            f"({target.name!r}): an MTP head belongs to the target it was trained on"
        )


def check_mtp_fits(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """CheckpointRefused unless the loaded head fits `target`."""
    _check_target_fit(checkpoint.config, target)


def describe_mtp(path: Path, raw: RawCheckpoint, request: LoadRequest) -> list[str]:
    """What `eval-worker inspect` says of an MTP checkpoint, before any target is involved."""
    layout, cfg, accepted = read_mtp_config(raw.config, request.inert_config_keys)
    state, unread = head_state(raw.state, layout, cfg)
    lines = [
        f"checkpoint         {path}",
        f"format             {raw.format}",
        f"family             MTP ({layout.name} layout, one head)",
        f"step / epoch       {raw.step} / {raw.epoch}",
        f"head               at {layout.prefix(int(cfg.num_hidden_layers))}*: {len(state)} tensors "
        f"({cfg.model_type} decoder block, hidden {cfg.hidden_size})",
        f"target layers      the last ({int(cfg.num_hidden_layers) - 1}) through the target's final norm",
        "embedding, lm_head the target's (/target/heads)" + (f"; not read: {unread}" if unread else ""),
    ]
    return lines + inert_lines(accepted)
