"""A DFlash checkpoint's config, as the published layout and SpecForge's trainer write it.

Every key is honoured (by `DFlashConfig.from_hf_dict` or here), known inert, or refuses the checkpoint
by name. SpecForge adds `draft_vocab_size` (its DFlash decodes with the target's full lm_head, so it
must equal `vocab_size`) and `dflash_config` switches for its variants, accepted at their defaults only.
A config without `mask_token_id` (SpecForge writes none unless told) needs `--mask-token-id`, as vLLM
refuses it too. Keys a trainer adds for itself (`training_step`) load only when the user names them inert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_worker.checkpoints.config_keys import INERT, KeysAccepted, check_keys
from eval_worker.errors import CheckpointRefused
from eval_worker.families.dflash.config import DFlashConfig

_KEYS = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling", "hidden_act",
    "attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "layer_types", "block_size",
    "mask_token_id", "num_target_layers", "dflash_config", "vocab_size", "draft_vocab_size",
    "tie_word_embeddings",  # inert: the drafter owns neither an embedding nor a head (the target's are used)
}  # fmt: skip
# SpecForge's dflash_config switches for its DFlash variants, with the values plain DFlash has.
_VARIANT_DEFAULTS: dict[str, Any] = {"projector_type": None, "pure_draft_prefix_len": 0, "shift_label": False}
_DFLASH_CONFIG_KEYS = {"target_layer_ids", "mask_token_id", "block_size", *_VARIANT_DEFAULTS}


def read_dflash_config(
    raw: Mapping[str, Any],
    *,
    block_size: int | None = None,
    mask_token_id: int | None = None,
    inert: frozenset[str] = frozenset(),
) -> tuple[DFlashConfig, KeysAccepted]:
    """The drafter config of a DFlash config dict, and the keys accepted as `inert` (at the top level or in
    `dflash_config`); `block_size` and `mask_token_id` as supplied by the user (a supplied mask token must
    agree with one the config names)."""
    accepted = check_keys(raw, INERT | _KEYS, "DFlash", inert)
    dflash = raw.get("dflash_config") or {}
    if not isinstance(dflash, Mapping):
        raise CheckpointRefused(f"config dflash_config must be an object, got {type(dflash).__name__}")
    accepted |= check_keys(dflash, _DFLASH_CONFIG_KEYS, "DFlash dflash_config", inert)
    for key, plain in _VARIANT_DEFAULTS.items():
        if dflash.get(key, plain) != plain:
            raise CheckpointRefused(
                f"config dflash_config.{key}={dflash[key]!r} is a DFlash variant not "
                f"implemented here (plain DFlash: {plain!r})"
            )
    draft_vocab, vocab = raw.get("draft_vocab_size"), raw.get("vocab_size")
    if draft_vocab is not None and draft_vocab != vocab:
        raise CheckpointRefused(
            f"config draft_vocab_size {draft_vocab} != vocab_size {vocab}: this DFlash drafter decodes with the "
            "target's full lm_head; a draft vocabulary is not implemented"
        )
    return DFlashConfig.from_hf_dict(raw, block_size=block_size, mask_token_id=mask_token_id), accepted
