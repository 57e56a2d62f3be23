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
from dataclasses import dataclass, field
from typing import Any

from torch import nn

# Renamed parts of a head: the published name (after the layout's prefix) -> the drafter's.
_DEEPSEEK_PARTS = {"enorm": "norm_embed", "hnorm": "norm_hidden", "eh_proj": "proj", "shared_head.norm": "norm_out"}
_QWEN_PARTS = {
    "pre_fc_norm_embedding": "norm_embed",
    "pre_fc_norm_hidden": "norm_hidden",
    "fc": "proj",
    "norm": "norm_out",
}


@dataclass(frozen=True)
class MtpLayout:
    """One layout: its name, the transformers module of its architecture and the classes the head is
    built from, the config keys counting its heads, where its keys sit and what they are called, and
    whether embeddings at position 0 are zeroed."""

    name: str
    model_types: tuple[str, ...]
    module: str  # transformers.models.<module>.modeling_<module>
    class_prefix: str  # transformers' {class_prefix}DecoderLayer and {class_prefix}RMSNorm
    rotary: str
    count_keys: tuple[str, ...]  # the config keys that may count its heads, the first found counts
    parts: Mapping[str, str] = field(hash=False)  # published part name -> the drafter's
    in_target_layers: bool  # heads are `model.layers.{L+i}.` (DeepSeek), else under `mtp.` (block `layers.0`)
    zero_position_0: bool
    unread: tuple[str, ...] = ()  # published parts not read (copies of the target's, which vLLM uses instead)
    fixed: tuple[tuple[str, object], ...] = ()  # keys transformers' implementation assumes these values of

    @property
    def decoder_layer(self) -> str:
        """transformers' decoder-layer class of the architecture, by name."""
        return f"{self.class_prefix}DecoderLayer"

    def classes(self) -> tuple[type[nn.Module], type[nn.Module], type[nn.Module]]:
        """The decoder-layer, RMSNorm and rotary-embedding classes transformers implements the target with."""
        modeling = importlib.import_module(f"transformers.models.{self.module}.modeling_{self.module}")
        names = (self.decoder_layer, f"{self.class_prefix}RMSNorm", self.rotary)
        layer, norm, rotary = (getattr(modeling, name) for name in names)
        return layer, norm, rotary

    def head_count(self, config: Mapping[str, Any]) -> int:
        """The MTP heads the config declares (0: none)."""
        count = next((config[k] for k in self.count_keys if k in config), 0)
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def prefix(self, num_layers: int) -> str:
        """Where the (first) head's keys start in the checkpoint."""
        return f"model.layers.{num_layers}." if self.in_target_layers else "mtp."

    def block_prefix(self, num_layers: int) -> str:
        """Where the (first) head's decoder block's keys start."""
        return self.prefix(num_layers) + ("" if self.in_target_layers else "layers.0.")

    def block_index(self, num_layers: int) -> int:
        """The layer index the block is built at: DeepSeek's head is layer L (MoE past
        first_k_dense_replace), the Qwen heads' is `mtp.layers.0` (vLLM reads its index from that name)."""
        return num_layers if self.in_target_layers else 0

    def drafter_key(self, key: str, num_layers: int) -> str | None:
        """A checkpoint key of the head -> the drafter's name for it (None: not the head's)."""
        prefix, block = self.prefix(num_layers), self.block_prefix(num_layers)
        if not key.startswith(prefix):
            return None
        rest = key.removeprefix(prefix)
        for old, new in self.parts.items():
            if rest.startswith(old + "."):
                return new + rest.removeprefix(old)
        return "block." + key.removeprefix(block) if key.startswith(block) else None


def _qwen(name: str, model_type: str, class_prefix: str, rotary: str, count_keys: tuple[str, ...]) -> MtpLayout:
    """A Qwen layout (transformers' module of its name): heads under `mtp.`, its parts named as Qwen3-Next
    names them, no position zeroed."""
    return MtpLayout(
        name=name,
        model_types=(model_type,),
        module=name,
        class_prefix=class_prefix,
        rotary=rotary,
        count_keys=count_keys,
        parts=_QWEN_PARTS,
        in_target_layers=False,
        zero_position_0=False,
    )


LAYOUTS = {
    layout.name: layout
    for layout in (
        MtpLayout(
            name="deepseek",
            model_types=("deepseek_v3",),
            module="deepseek_v3",
            class_prefix="DeepseekV3",
            rotary="DeepseekV3RotaryEmbedding",
            count_keys=("num_nextn_predict_layers",),
            parts=_DEEPSEEK_PARTS,
            in_target_layers=True,
            zero_position_0=True,
            unread=("embed_tokens", "shared_head.head"),
            fixed=(("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("moe_layer_freq", 1)),
        ),
        _qwen(  # vLLM's key counts the heads, else the published one
            "qwen3_next",
            "qwen3_next",
            "Qwen3Next",
            "Qwen3NextRotaryEmbedding",
            ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
        ),
        _qwen("qwen3_5", "qwen3_5_text", "Qwen3_5", "Qwen3_5TextRotaryEmbedding", ("mtp_num_hidden_layers",)),
        _qwen(
            "qwen3_5_moe", "qwen3_5_moe_text", "Qwen3_5Moe", "Qwen3_5MoeTextRotaryEmbedding", ("mtp_num_hidden_layers",)
        ),
    )
}


def layout_of(config: Mapping[str, Any]) -> MtpLayout | None:
    """The layout of a target config that declares MTP heads, else None."""
    for layout in LAYOUTS.values():
        if config.get("model_type") in layout.model_types and layout.head_count(config) > 0:
            return layout
    return None
