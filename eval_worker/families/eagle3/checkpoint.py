"""Load EAGLE-3 drafters strictly: every tensor accounted for, every shape checked, before any math.

The layout (`eagle3_layouts`) says what the config means; this module checks the tensors against it and
the target: fc width against the layer ids, the vocabularies (a draft vocab smaller than the target's
needs `d2t`), the embedding (borrowed from the target only when widths agree). A checkpoint is read as
vLLM reads it: `t2d`, which vLLM skips, is never used, and one that disagrees with `d2t` is a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from eval_worker.checkpoints.config_keys import inert_lines
from eval_worker.checkpoints.layer_ids import ResolvedLayerIds, resolve_eagle3_layer_ids, to_decoder_outputs
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest, requested_options
from eval_worker.checkpoints.raw import RawCheckpoint
from eval_worker.checkpoints.state_checks import check_key_set, check_shapes, module_shapes
from eval_worker.errors import CheckpointRefused
from eval_worker.families.eagle3.config import Eagle3Config
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.layouts import Eagle3Layout, read_layout
from schemas.eval_spec import Eagle3Options
from schemas.model import ModelInfo

log = logging.getLogger(__name__)

_LAYER = "midlayer."


def load_eagle3(path: Path, raw: RawCheckpoint, target: ModelInfo, request: LoadRequest) -> LoadedCheckpoint:
    """The EAGLE-3 drafter `raw` holds, read in its layout and fitting `target`, or CheckpointRefused."""
    options = requested_options(request, Eagle3Options)
    layout = read_layout(raw.config, request.inert_config_keys)
    drafter, ids, t2d_warnings = _load_state(raw.state, layout, target, request.layer_ids, options)
    warnings = layout.keys.warnings + t2d_warnings
    for warning in warnings:
        log.warning("%s: %s", path, warning)
    log.info(
        "loaded EAGLE-3 (%s layout) %s checkpoint %s (step %s): layer ids %s as %s (%s) = target layers %s (%s)",
        layout.layout,
        raw.format,
        path,
        raw.step,
        list(ids.checkpoint_ids or []),
        ids.convention,
        ids.convention_source,
        list(ids.ids),
        ids.source,
    )
    cfg = layout.config
    return LoadedCheckpoint(
        path,
        raw.format,
        "eagle3",
        layout.layout,
        cfg,
        drafter,
        ids,
        raw.step,
        raw.epoch,
        cfg.target_hidden_size,
        options=options,
        inert_config_keys=layout.keys.inert,
        warnings=warnings,
    )


def check_eagle3_fits(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """CheckpointRefused unless the loaded drafter fits `target`."""
    assert isinstance(checkpoint.config, Eagle3Config)
    _check_target(checkpoint.config, target)


def expected_shapes(cfg: Eagle3Config, num_taps: int) -> dict[str, tuple[int, ...]]:
    """The tensors every EAGLE-3 drafter of `cfg` has (EAGLE key names), before the optional ones (`d2t`,
    `t2d`, `embed_tokens`)."""
    return module_shapes(lambda: Eagle3Drafter(cfg, num_taps, has_embed=False), skip={"d2t"})


def describe_eagle3(path: Path, raw: RawCheckpoint, request: LoadRequest) -> list[str]:
    """What `eval-worker inspect` says of an EAGLE-3 checkpoint, before any target is involved."""
    layout = read_layout(raw.config, request.inert_config_keys)
    cfg = layout.config
    if layout.layer_ids is None:
        ids = "none written: EAGLE-3 defaults, layer inputs (2, L//2, L-3) = decoder outputs [1, L//2-1, L-4]"
    else:
        meaning = "0-based decoder outputs" if layout.convention == "decoder_output_0based" else "layer inputs"
        ids = f"{list(layout.layer_ids)} as {layout.convention} ({meaning}, the {layout.layout} convention)"
        if 0 not in layout.layer_ids:
            ids += f" = served layers {list(to_decoder_outputs(layout.layer_ids, layout.convention))}"
    named = {
        "norm_before_residual": cfg.norm_before_residual,
        "qk_norm": cfg.qk_norm,
        "feeds norm(x) back": cfg.feed_normed,
        "logits from raw x": not cfg.logits_from_norm,
        f"feature norm {cfg.feature_norm}": cfg.feature_norm != "none",
        f"sliding window {cfg.sliding_window}": cfg.sliding_window is not None,
        "lm_head tied to embed_tokens": cfg.tied_lm_head,
    }
    flags = [name for name, on in named.items() if on]
    lines = [
        f"checkpoint         {path}",
        f"format             {raw.format}",
        f"family             EAGLE-3, {layout.layout} layout",
        f"step / epoch       {raw.step} / {raw.epoch}",
        f"drafter            1 layer, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads "
        f"({cfg.num_key_value_heads} kv) x {cfg.head_dim}, intermediate {cfg.intermediate_size}",
        f"vocab              draft {cfg.draft_vocab_size} of target {cfg.vocab_size} "
        f"({'d2t' if 'd2t' in raw.state else 'no d2t'}), embed_tokens "
        f"{'in the checkpoint' if 'embed_tokens.weight' in raw.state else 'from the target'}",
        f"math flags         {', '.join(flags) or 'none'}",
        f"chain steps        {cfg.speculative_tokens or 'not named (default 5)'}",
        f"layer ids          {ids}",
        f"tensors            {len(raw.state)}",
    ]
    return lines + inert_lines(layout.keys)


def _load_state(
    state: Mapping[str, Tensor],
    layout: Eagle3Layout,
    target: ModelInfo,
    layer_ids_override: tuple[int, ...] | None,
    options: Eagle3Options,
) -> tuple[Eagle3Drafter, ResolvedLayerIds, tuple[str, ...]]:
    """The drafter `state` (keys as the layout names them) holds, for `target`, its layer ids, and what
    a report should say of its `t2d`."""
    cfg = layout.config
    _check_target(cfg, target)
    state = {
        (_LAYER + k[len(layout.key_prefix) :] if k.startswith(layout.key_prefix) else k): v for k, v in state.items()
    }
    fc = state.get("fc.weight")
    if fc is None or fc.dim() != 2:
        raise CheckpointRefused(f"the {layout.layout} checkpoint has no 2-d fc.weight")
    layer_ids = resolve_eagle3_layer_ids(
        checkpoint_ids=layout.layer_ids,
        layout_convention=layout.convention,
        convention_override=options.layer_convention,
        override=layer_ids_override,
        fc_width=fc.shape[1],
        target_hidden_size=cfg.target_hidden_size,
        num_target_layers=target.num_layers,
    )
    if cfg.tied_lm_head:
        state = _tie(state, cfg)
    expected = expected_shapes(cfg, len(layer_ids.ids))
    check_key_set(state, expected, optional={"d2t", "t2d", "embed_tokens.weight"})
    check_shapes(state, expected)
    has_embed = "embed_tokens.weight" in state
    if has_embed:
        check_shapes(state, {"embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)})
    elif cfg.hidden_size != cfg.target_hidden_size:
        raise CheckpointRefused(
            f"the checkpoint has no embed_tokens.weight and its hidden size {cfg.hidden_size} differs from the "
            f"target's {cfg.target_hidden_size}, so the target's embedding cannot stand in for it"
        )
    weights = {k: v for k, v in state.items() if k != "t2d"}
    weights["d2t"] = _d2t(state, cfg)
    t2d = _t2d_problem(state["t2d"], weights["d2t"], cfg) if "t2d" in state else None
    drafter = Eagle3Drafter(cfg, len(layer_ids.ids), has_embed=has_embed)
    try:
        drafter.load_state_dict(weights, strict=True)
    except RuntimeError as exc:  # unreachable after the checks above, but never continue on a bad load
        raise CheckpointRefused(f"load_state_dict(strict=True) failed: {exc}") from exc
    return drafter.eval(), layer_ids, (t2d,) if t2d is not None else ()


def _tie(state: Mapping[str, Tensor], cfg: Eagle3Config) -> dict[str, Tensor]:
    """`state` with lm_head = embed_tokens, as `tie_word_embeddings: true` means (a saved lm_head must equal it)."""
    embed = state.get("embed_tokens.weight")
    if cfg.draft_vocab_size != cfg.vocab_size or embed is None:
        raise CheckpointRefused(
            f"config tie_word_embeddings is true, which makes lm_head the embedding: that needs the checkpoint's "
            f"embed_tokens.weight (present: {embed is not None}) and a draft vocab equal to the vocab "
            f"({cfg.draft_vocab_size} vs {cfg.vocab_size})"
        )
    saved = state.get("lm_head.weight")
    if saved is not None and not torch.equal(saved, embed):
        raise CheckpointRefused(
            "config tie_word_embeddings is true but lm_head.weight differs from embed_tokens.weight"
        )
    return {**state, "lm_head.weight": embed}


def _check_target(cfg: Eagle3Config, target: ModelInfo) -> None:
    if cfg.target_hidden_size != target.hidden_size:
        raise CheckpointRefused(
            f"the drafter reads taps of width {cfg.target_hidden_size} (target_hidden_size, else hidden_size); "
            f"target {target.name!r} has hidden size {target.hidden_size}"
        )
    if cfg.vocab_size != target.vocab_size:
        raise CheckpointRefused(
            f"drafter vocab_size {cfg.vocab_size} != target {target.name!r} vocab_size {target.vocab_size}"
        )


def _d2t(state: Mapping[str, Tensor], cfg: Eagle3Config) -> Tensor:
    """The draft-to-target offsets, checked to map the draft vocab one-to-one into the target vocab."""
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    d2t = state.get("d2t")
    if d2t is None:
        if vd < v:
            raise CheckpointRefused(
                f"the draft vocab ({vd} = lm_head.weight rows) is smaller than the target vocab ({v}) and the "
                "checkpoint has no d2t to map draft ids to target ids"
            )
        return torch.zeros(vd, dtype=torch.long)
    if tuple(d2t.shape) != (vd,) or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise CheckpointRefused(f"d2t has shape {list(d2t.shape)} and dtype {d2t.dtype}, expected integer [{vd}]")
    targets = torch.arange(vd) + d2t.long()
    if int(targets.min()) < 0 or int(targets.max()) >= v or targets.unique().numel() != vd:
        raise CheckpointRefused(f"d2t maps draft ids outside the target vocab [0, {v}) or two onto one target id")
    return d2t.long()


def _t2d_problem(t2d: Tensor, d2t: Tensor, cfg: Eagle3Config) -> str | None:
    """How `t2d` (which target ids the draft vocab holds) fails to restate `d2t`, or None when it does.

    vLLM's EAGLE-3 `load_weights` skips `t2d` and drafts through `d2t` alone, so a `t2d` that disagrees,
    or is malformed, changes nothing an engine computes: a warning, never a refusal."""
    ignored = "; t2d is not read (vLLM reads d2t only), so drafting follows d2t"
    if tuple(t2d.shape) != (cfg.vocab_size,) or t2d.dtype != torch.bool:
        return f"t2d has shape {list(t2d.shape)} and dtype {t2d.dtype}, expected bool [{cfg.vocab_size}]{ignored}"
    held = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    held[torch.arange(cfg.draft_vocab_size) + d2t] = True
    differ = (t2d != held).nonzero().flatten()
    if differ.numel() == 0:
        return None
    first = int(differ[0])
    return (
        f"t2d disagrees with d2t: t2d marks {int(t2d.sum())} target ids, d2t maps the {cfg.draft_vocab_size} "
        f"draft ids to {int(held.sum())}; they differ at {differ.numel()} target ids, the first {first} "
        f"(t2d {bool(t2d[first])}, d2t {bool(held[first])}){ignored}"
    )
