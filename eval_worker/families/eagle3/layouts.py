"""The three published EAGLE-3 checkpoint layouts, read into one `Eagle3Config` and one key naming.

- **eagle** (SafeAILab): a Llama config + `draft_vocab_size` (+ `target_hidden_size`); keys `midlayer.*`;
  no layer ids: the defaults `(2, L//2, L-3)` in the layer-input convention.
- **specforge**: the same keys (+ `fc_norm.{i}`), flags `fc_norm` / `norm_output`, and ids in
  `eagle_config.eagle_aux_hidden_state_layer_ids` in the decoder-output convention.
- **speculators** (vLLM): `speculators_model_type: "eagle3"`, a nested `transformer_layer_config`, keys
  `layers.0.*` (+ `input_norm` for `norm_before_fc`), ids in the layer-input convention.

Every config key is either honoured or known not to change the math; any other key the user did not name
inert, or a known one with a value this drafter does not implement, refuses the checkpoint. `norm_output`
means different things in SpecForge (logits read `norm(x)`, default on) and speculators (later steps read `norm(x)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from eval_worker.checkpoints.config_keys import INERT, KeysAccepted, check_keys
from eval_worker.checkpoints.layer_ids import LayerConvention
from eval_worker.errors import CheckpointRefused
from eval_worker.families.eagle3.config import Eagle3Config, FeatureNorm

Layout = Literal["eagle", "specforge", "speculators"]

# HF fields that do, each read below, with the only values this drafter implements when fixed.
_SHAPE = {
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
    "rope_theta", "rope_parameters", "vocab_size", "num_hidden_layers",
}  # fmt: skip
_FIXED: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,), "rope_scaling": (None,),
    "pretraining_tp": (1,),
}  # fmt: skip
# HF fields read by `_window` (the attention span) and `_layer_config` (tie_word_embeddings: lm_head = embed_tokens).
_ATTENTION = {"use_sliding_window", "sliding_window", "layer_types", "tie_word_embeddings"}
MIN_SLIDING_WINDOW = 65  # longer than any chain (64 steps), so a round's own nodes always see each other
_EAGLE_FIELDS = {"draft_vocab_size", "target_hidden_size"}
_SPECFORGE_FIELDS = {"eagle_config", "fc_norm", "norm_output"}
_SPECULATORS_FIELDS = {
    "speculators_model_type", "transformer_layer_config", "draft_vocab_size", "target_hidden_size",
    "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "eagle_aux_hidden_state_layer_ids",
    "speculators_config", "speculators_version",
}  # fmt: skip


@dataclass(frozen=True)
class Eagle3Layout:
    """A checkpoint's layout as read: the drafter config, its layer ids as written and what they mean."""

    layout: Layout
    config: Eagle3Config
    layer_ids: tuple[int, ...] | None  # as written; None: the layout's defaults apply
    convention: LayerConvention
    key_prefix: str  # the decoder layer's key prefix in this layout ("midlayer." or "layers.0.")
    keys: KeysAccepted  # config keys accepted because the request named them inert


def is_eagle3(raw: Mapping[str, Any]) -> bool:
    """Whether a config dict describes an EAGLE-3 drafter, decided by what the file says it is
    (`architectures`, `speculators_model_type`) before incidental keys such as `draft_vocab_size`, which
    SpecForge writes for DFlash too (a file naming a DFlash architecture or `dflash_config` is not
    EAGLE-3's); CheckpointRefused for a speculators drafter of another kind."""
    archs = [str(a) for a in raw.get("architectures") or []]
    kind = raw.get("speculators_model_type")
    if kind is not None:
        if kind != "eagle3":
            theirs = " (speculators' DFlash drafts over a vocabulary and head of its own)" if kind == "dflash" else ""
            raise CheckpointRefused(f"speculators_model_type {kind!r}: only eagle3 speculators are read here{theirs}")
        return True
    if any("dflash" in a.lower() for a in archs) or "dflash_config" in raw:
        return False
    return "draft_vocab_size" in raw or any("eagle3" in a.lower() for a in archs)


def read_layout(raw: Mapping[str, Any], inert: frozenset[str] = frozenset()) -> Eagle3Layout:
    """The layout of an EAGLE-3 config dict, refusing what this drafter would not compute exactly; keys
    no layout knows are accepted only when `inert` names them (in any block: top level or nested)."""
    if "speculators_model_type" in raw:
        return _speculators(raw, inert)
    if _SPECFORGE_FIELDS & raw.keys():
        return _specforge(raw, inert)
    keys = check_keys(raw, INERT | _SHAPE | _FIXED.keys() | _ATTENTION | _EAGLE_FIELDS, "EAGLE", inert)
    return Eagle3Layout("eagle", _layer_config(raw, raw), None, "layer_input", "midlayer.", keys)


def _specforge(raw: Mapping[str, Any], inert: frozenset[str]) -> Eagle3Layout:
    known = INERT | _SHAPE | _FIXED.keys() | _ATTENTION | _EAGLE_FIELDS | _SPECFORGE_FIELDS
    keys = check_keys(raw, known, "SpecForge", inert)
    eagle_config = _mapping(raw.get("eagle_config") or {}, "eagle_config")
    keys |= check_keys(
        eagle_config, {"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"}, "SpecForge eagle_config", inert
    )
    if eagle_config.get("use_aux_hidden_state", True) is not True:
        raise CheckpointRefused("eagle_config.use_aux_hidden_state is false: an EAGLE-3 drafter reads its 3 taps")
    cfg = replace(
        _layer_config(raw, raw),
        feature_norm="per_tap" if _flag(raw, "fc_norm", False) else "none",
        logits_from_norm=_flag(raw, "norm_output", True),
    )
    return Eagle3Layout(
        "specforge",
        cfg,
        _ids(eagle_config.get("eagle_aux_hidden_state_layer_ids")),
        "decoder_output_0based",
        "midlayer.",
        keys,
    )


def _speculators(raw: Mapping[str, Any], inert: frozenset[str]) -> Eagle3Layout:
    if raw["speculators_model_type"] != "eagle3":
        raise CheckpointRefused(f"speculators_model_type {raw['speculators_model_type']!r} is not an EAGLE-3 drafter")
    keys = check_keys(raw, INERT | _SPECULATORS_FIELDS | {"tie_word_embeddings"}, "speculators", inert)
    layer = _mapping(raw.get("transformer_layer_config"), "transformer_layer_config")
    where = "speculators transformer_layer_config"
    keys |= check_keys(layer, INERT | _SHAPE | _FIXED.keys() | _ATTENTION, where, inert)
    layer_type = layer.get("model_type", "qwen3")  # speculators' own default layer is Qwen3
    if layer_type not in ("llama", "qwen3"):
        raise CheckpointRefused(f"transformer_layer_config.model_type {layer_type!r}: only llama and qwen3 layers")
    if _flag(raw, "norm_before_fc", False) and _flag(raw, "fc_norm", False):
        raise CheckpointRefused("config sets both norm_before_fc and fc_norm, which are mutually exclusive")
    feature_norm: FeatureNorm = (
        "concat" if _flag(raw, "norm_before_fc", False) else "per_tap" if _flag(raw, "fc_norm", False) else "none"
    )
    cfg = replace(
        _layer_config(layer, raw),
        qk_norm=layer_type == "qwen3",
        norm_before_residual=_flag(raw, "norm_before_residual", False),
        feature_norm=feature_norm,
        feed_normed=_flag(raw, "norm_output", False),
        speculative_tokens=_speculative_tokens(raw.get("speculators_config")),
    )
    return Eagle3Layout(
        "speculators", cfg, _ids(raw.get("eagle_aux_hidden_state_layer_ids")), "layer_input", "layers.0.", keys
    )


def _layer_config(layer: Mapping[str, Any], top: Mapping[str, Any]) -> Eagle3Config:
    """Shape fields from the layer's config; draft vocab and target width from the top level."""
    for key, allowed in _FIXED.items():
        if key in layer and layer[key] not in allowed:
            raise CheckpointRefused(
                f"config {key}={layer[key]!r} changes the math and is not implemented here "
                f"(implemented: {list(allowed)})"
            )
    if _int(layer, "num_hidden_layers") != 1:
        raise CheckpointRefused(
            f"config num_hidden_layers={layer['num_hidden_layers']}: only single-layer EAGLE-3 drafters are implemented"
        )
    hidden, heads = _int(layer, "hidden_size"), _int(layer, "num_attention_heads")
    tied = _flag(top, "tie_word_embeddings", False)  # the drafter's own; a nested layer config's builds no embedding
    kv_heads = int(layer.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise CheckpointRefused(
            f"config num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    vocab = _int(layer, "vocab_size")
    draft_vocab = int(top.get("draft_vocab_size") or vocab)
    if not 0 < draft_vocab <= vocab:
        raise CheckpointRefused(f"config draft_vocab_size {draft_vocab} is not in 1..vocab_size {vocab}")
    head_dim = int(layer.get("head_dim") or hidden // heads)
    if head_dim % 2:
        raise CheckpointRefused(f"config head_dim must be even for RoPE, got {head_dim}")
    return Eagle3Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(layer, "intermediate_size"),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(layer),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=int(top.get("target_hidden_size") or hidden),
        sliding_window=_window(layer),
        tied_lm_head=tied,
    )


def _window(layer: Mapping[str, Any]) -> int | None:
    """The decoder layer's attention span: None for full attention, else its sliding window, which
    speculators' trainer sets on every draft layer by default (2048)."""
    types = layer.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or len(set(types)) != 1 or types[0] not in ("full_attention", "sliding_attention")
    ):
        raise CheckpointRefused(
            f"config layer_types {types!r}: one attention type for the drafter's layer, "
            "full_attention or sliding_attention"
        )
    sliding = _flag(layer, "use_sliding_window", False)
    if types is None and sliding:
        raise CheckpointRefused("config sets use_sliding_window without layer_types: which layers slide is unclear")
    if types is None or types[0] == "full_attention":
        return None
    window = layer.get("sliding_window")
    if not sliding or not isinstance(window, int) or isinstance(window, bool) or window < MIN_SLIDING_WINDOW:
        raise CheckpointRefused(
            f"config layer_types sliding_attention needs use_sliding_window true and a sliding_window of at least "
            f"{MIN_SLIDING_WINDOW}, got use_sliding_window={layer.get('use_sliding_window')!r}, "
            f"sliding_window={window!r}"
        )
    return window


def _rope_theta(layer: Mapping[str, Any]) -> float:
    params = _mapping(layer.get("rope_parameters") or {}, "rope_parameters")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointRefused(f"config asks for RoPE type {rope_type!r}; only default RoPE is implemented")
    return float(layer.get("rope_theta", params.get("rope_theta", 10000.0)))


def _speculative_tokens(speculators_config: Any) -> int | None:
    """The greedy proposal's `speculative_tokens`, when the config names one."""
    if speculators_config is None:
        return None
    methods = _mapping(speculators_config, "speculators_config").get("proposal_methods") or []
    counts = {int(m["speculative_tokens"]) for m in methods if isinstance(m, Mapping) and "speculative_tokens" in m}
    if len(counts) > 1:
        raise CheckpointRefused(f"speculators_config proposal_methods name several speculative_tokens {sorted(counts)}")
    return counts.pop() if counts else None


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CheckpointRefused(f"config {what} must be an object, got {type(value).__name__}")
    return value


def _flag(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise CheckpointRefused(f"config {key} must be true or false, got {value!r}")
    return value


def _int(raw: Mapping[str, Any], key: str) -> int:
    if not isinstance(raw.get(key), int) or isinstance(raw.get(key), bool):
        raise CheckpointRefused(f"config lacks integer field {key!r}")
    return int(raw[key])


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise CheckpointRefused(f"eagle_aux_hidden_state_layer_ids must be a list of integers, got {value!r}")
    return tuple(value)
