"""The shape every drafter's decoder layers share: a Llama-style layer's widths, heads, norm epsilon
and RoPE base. Each family's config extends it with what is its own."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderShape:
    """A Llama-style decoder layer: width, attention heads (grouped-query), head width, MLP width, the
    RMSNorm epsilon and the RoPE base."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
