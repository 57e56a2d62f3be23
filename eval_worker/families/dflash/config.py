"""The DFlash drafter's configuration, parsed from (and written back to) a HF `config.json` dict.

Accepts the three published placements of `mask_token_id` / `block_size`; refuses configs that ask
for features this implementation does not have (biases, sliding windows, scaled RoPE).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from eval_worker.drafters.shape import DecoderShape
from eval_worker.errors import CheckpointRefused

HfLayout = Literal["published", "top_level", "block_in_dflash_config"]


@dataclass(frozen=True)
class DFlashConfig(DecoderShape):
    """The drafter's shape, its layer count and its DFlash fields (block size, mask token, target layers)."""

    num_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...] | None = None
    num_target_layers: int | None = None
    vocab_size: int | None = None  # the target vocab it was built for, when the config says

    @classmethod
    def from_hf_dict(
        cls, raw: Mapping[str, Any], *, block_size: int | None = None, mask_token_id: int | None = None
    ) -> DFlashConfig:
        """Parse a HF config dict; `block_size` (an evaluation choice) replaces the config's if given;
        `mask_token_id` stands in for a config without one (one that names another is refused)."""
        dflash = raw.get("dflash_config") or {}
        if not isinstance(dflash, Mapping):
            raise CheckpointRefused(f"config dflash_config must be an object, got {type(dflash).__name__}")
        _refuse_unsupported(raw)
        heads = _int(raw, "num_attention_heads")
        hidden = _int(raw, "hidden_size")
        ids = _one_of(raw, dflash, "target_layer_ids", required=False)
        num_target = raw.get("num_target_layers")
        cfg = cls(
            hidden_size=hidden,
            num_layers=_int(raw, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=_int(raw, "intermediate_size"),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw),
            block_size=int(block_size or _one_of(raw, dflash, "block_size", required=True)),
            mask_token_id=_mask_token_id(raw, dflash, mask_token_id),
            target_layer_ids=tuple(int(k) for k in ids) if ids is not None else None,
            num_target_layers=int(num_target) if num_target is not None else None,
            vocab_size=_int(raw, "vocab_size") if raw.get("vocab_size") is not None else None,
        )
        if cfg.block_size < 2:
            raise CheckpointRefused(f"config block_size must be at least 2, got {cfg.block_size}")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise CheckpointRefused(
                f"config num_attention_heads {heads} is not a multiple of num_key_value_heads {cfg.num_key_value_heads}"
            )
        if cfg.head_dim % 2:
            raise CheckpointRefused(f"config head_dim must be even for RoPE, got {cfg.head_dim}")
        return cfg

    def to_hf_dict(self, layout: HfLayout = "published") -> dict[str, Any]:
        """A Qwen3-style config dict; `layout` picks where mask_token_id and block_size go."""
        out: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
        }
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        if self.vocab_size is not None:
            out["vocab_size"] = self.vocab_size
        dflash: dict[str, Any] = {}
        if self.target_layer_ids is not None:
            dflash["target_layer_ids"] = list(self.target_layer_ids)
        if layout == "top_level":
            out["mask_token_id"] = self.mask_token_id
            out["block_size"] = self.block_size
        elif layout == "block_in_dflash_config":
            dflash["mask_token_id"] = self.mask_token_id
            dflash["block_size"] = self.block_size
        else:
            dflash["mask_token_id"] = self.mask_token_id
            out["block_size"] = self.block_size
        if dflash:
            out["dflash_config"] = dflash
        return out


def _int(raw: Mapping[str, Any], key: str) -> int:
    if raw.get(key) is None:
        raise CheckpointRefused(f"config lacks required field {key!r}")
    return int(raw[key])


def _one_of(raw: Mapping[str, Any], dflash: Mapping[str, Any], key: str, *, required: bool) -> Any:
    """`key` from dflash_config or the top level; both present must agree."""
    nested, top = dflash.get(key), raw.get(key)
    if nested is not None and top is not None and nested != top:
        raise CheckpointRefused(f"config has {key}={top} at the top level but {nested} in dflash_config")
    value = nested if nested is not None else top
    if value is None and required:
        raise CheckpointRefused(f"config lacks {key!r} (looked at the top level and in dflash_config)")
    return value


def _mask_token_id(raw: Mapping[str, Any], dflash: Mapping[str, Any], supplied: int | None) -> int:
    """The config's mask token, else the supplied one; refused when neither or when they differ."""
    named = _one_of(raw, dflash, "mask_token_id", required=False)
    if named is not None:
        if supplied is not None and int(named) != supplied:
            raise CheckpointRefused(f"--mask-token-id {supplied} contradicts the config's mask_token_id {named}")
        return int(named)
    if supplied is None:
        raise CheckpointRefused(
            "config names no mask_token_id (looked at the top level and in dflash_config): pass --mask-token-id "
            "with the id the drafter was trained with (a spare row of the target's embedding), or write it to "
            "dflash_config.mask_token_id"
        )
    return supplied


def _rope_theta(raw: Mapping[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default" or raw.get("rope_scaling"):
        raise CheckpointRefused(f"config asks for RoPE type {rope_type!r} / rope_scaling; only default RoPE")
    theta = raw.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise CheckpointRefused("config has neither rope_theta nor rope_parameters.rope_theta")
    return float(theta)


def _refuse_unsupported(raw: Mapping[str, Any]) -> None:
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise CheckpointRefused("config asks for biases; the DFlash drafter has none")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointRefused(f"config hidden_act {raw['hidden_act']!r} is not silu")
    layer_types = raw.get("layer_types") or []
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise CheckpointRefused("config asks for sliding-window attention, which this drafter does not implement")
