"""`eval-worker inspect`: what a checkpoint is and which target layers it needs, without evaluating."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eval_worker.checkpoints.dflash_layout import read_dflash_config
from eval_worker.checkpoints.eagle3_layouts import is_eagle3, read_layout
from eval_worker.checkpoints.layer_ids import default_layer_ids, to_decoder_outputs
from eval_worker.checkpoints.loading import RawCheckpoint, load_checkpoint, read_raw

if TYPE_CHECKING:
    from cache_server.client import CacheClient


def describe_checkpoint(
    path: Path, *, config_path: Path | None = None, mask_token_id: int | None = None, client: CacheClient | None = None
) -> str:
    """What `eval-worker inspect` prints; with a `client`, also the layers it would fetch from its target."""
    raw = read_raw(path, config_path)
    lines = _describe_eagle3(path, raw) if is_eagle3(raw.config) else _describe_dflash(path, raw, mask_token_id)
    if client is not None:
        info = client.model()
        ckpt = load_checkpoint(
            path, info, config_path=config_path, mask_token_id=mask_token_id
        )  # raises CheckpointRefused if unfit
        lines.append(
            f"against {info.name:<10} layers {list(ckpt.target_layer_ids)} ({ckpt.layer_ids_source}); loads strictly"
        )
    return "\n".join(lines)


def _describe_eagle3(path: Path, raw: RawCheckpoint) -> list[str]:
    layout = read_layout(raw.config)
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
    return [
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


def _describe_dflash(path: Path, raw: RawCheckpoint, mask_token_id: int | None) -> list[str]:
    cfg = read_dflash_config(raw.config, mask_token_id=mask_token_id)
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
    return [
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
