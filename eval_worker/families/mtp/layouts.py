"""The MTP layouts: where a target's multi-token-prediction heads live in its checkpoint and what each
tensor is, as the published checkpoints name them and vLLM 0.32 loads them.

- **deepseek** (DeepSeek-V3/V3.2, `num_nextn_predict_layers` heads): `model.layers.{L+i}.` holds
  `enorm`, `hnorm`, `eh_proj`, `shared_head.norm` and a decoder block (every other key); its
  `embed_tokens` and `shared_head.head` copies are not read (vLLM drafts with the target's
  embedding and lm_head). Embeddings at position 0 are zeroed.
- **qwen3_next**, **qwen3_5**, **qwen3_5_moe** (Qwen3-Next, and the text models of Qwen3.5 and
  Qwen3.5-MoE; `num_nextn_predict_layers` or `mtp_num_hidden_layers` heads): `mtp.` holds `fc`,
  `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm` and the blocks `layers.{i}` (full attention).

Either way a head reads `cat(norm_e(embed(token)), norm_h(h))` through a projection and one decoder
block (transformers' own class for the target's architecture), and its output normed gives both the
logits (through the target's lm_head) and the hidden state the next step reads.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

# Renamed parts of a head: the published name (after the layout's prefix) -> the drafter's.
_DEEPSEEK_PARTS = {"enorm": "norm_embed", "hnorm": "norm_hidden", "eh_proj": "proj", "shared_head.norm": "norm_out"}
_QWEN3_NEXT_PARTS = {
    "pre_fc_norm_embedding": "norm_embed",
    "pre_fc_norm_hidden": "norm_hidden",
    "fc": "proj",
    "norm": "norm_out",
}
DEEPSEEK_UNREAD = ("embed_tokens", "shared_head.head")  # copies of the target's, which vLLM uses instead


@dataclass(frozen=True)
class MtpLayout:
    """One layout: its name, the transformers module of its architecture and the classes the head is
    built from, the config key counting its heads, and whether embeddings at position 0 are zeroed."""

    name: str
    model_types: tuple[str, ...]
    module: str  # transformers.models.<module>.modeling_<module>
    decoder_layer: str
    rms_norm: str
    rotary: str
    count_keys: tuple[str, ...]  # the config keys that may count its heads, the first found counts
    zero_position_0: bool
    fixed: tuple[tuple[str, object], ...] = ()  # keys transformers' implementation assumes these values of

    def classes(self) -> tuple[type[nn.Module], type[nn.Module], type[nn.Module]]:
        """The decoder-layer, RMSNorm and rotary-embedding classes transformers implements the target with."""
        modeling = importlib.import_module(f"transformers.models.{self.module}.modeling_{self.module}")
        return getattr(modeling, self.decoder_layer), getattr(modeling, self.rms_norm), getattr(modeling, self.rotary)

    def head_count(self, config: Mapping[str, Any]) -> int:
        """The MTP heads the config declares (0: none)."""
        count = next((config[k] for k in self.count_keys if k in config), 0)
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def prefix(self, num_layers: int) -> str:
        """Where the (first) head's keys start in the checkpoint."""
        return f"model.layers.{num_layers}." if self.name == "deepseek" else "mtp."

    def drafter_key(self, key: str, num_layers: int) -> str | None:
        """A checkpoint key of the head -> the drafter's name for it (None: not the head's)."""
        prefix = self.prefix(num_layers)
        if not key.startswith(prefix):
            return None
        rest = key.removeprefix(prefix)
        for old, new in self.parts.items():
            if rest.startswith(old + "."):
                return new + rest.removeprefix(old)
        if self.name == "deepseek":
            return "block." + rest
        return "block." + rest.removeprefix("layers.0.") if rest.startswith("layers.0.") else None

    @property
    def parts(self) -> dict[str, str]:
        """Published part name -> the drafter's, for the head's norms and projection."""
        return _DEEPSEEK_PARTS if self.name == "deepseek" else _QWEN3_NEXT_PARTS


LAYOUTS = {
    layout.name: layout
    for layout in (
        MtpLayout(
            name="deepseek",
            model_types=("deepseek_v3",),
            module="deepseek_v3",
            decoder_layer="DeepseekV3DecoderLayer",
            rms_norm="DeepseekV3RMSNorm",
            rotary="DeepseekV3RotaryEmbedding",
            count_keys=("num_nextn_predict_layers",),
            zero_position_0=True,
            fixed=(("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("moe_layer_freq", 1)),
        ),
        MtpLayout(
            name="qwen3_next",
            model_types=("qwen3_next",),
            module="qwen3_next",
            decoder_layer="Qwen3NextDecoderLayer",
            rms_norm="Qwen3NextRMSNorm",
            rotary="Qwen3NextRotaryEmbedding",
            count_keys=("num_nextn_predict_layers", "mtp_num_hidden_layers"),  # vLLM's key, the published one
            zero_position_0=False,
        ),
        MtpLayout(
            name="qwen3_5",
            model_types=("qwen3_5_text",),
            module="qwen3_5",
            decoder_layer="Qwen3_5DecoderLayer",
            rms_norm="Qwen3_5RMSNorm",
            rotary="Qwen3_5TextRotaryEmbedding",
            count_keys=("mtp_num_hidden_layers",),
            zero_position_0=False,
        ),
        MtpLayout(
            name="qwen3_5_moe",
            model_types=("qwen3_5_moe_text",),
            module="qwen3_5_moe",
            decoder_layer="Qwen3_5MoeDecoderLayer",
            rms_norm="Qwen3_5MoeRMSNorm",
            rotary="Qwen3_5MoeTextRotaryEmbedding",
            count_keys=("mtp_num_hidden_layers",),
            zero_position_0=False,
        ),
    )
}


def layout_of(config: Mapping[str, Any]) -> MtpLayout | None:
    """The layout of a target config that declares MTP heads, else None."""
    for layout in LAYOUTS.values():
        if config.get("model_type") in layout.model_types and layout.head_count(config) > 0:
            return layout
    return None
