"""The EAGLE-3 drafter's shape and the switches that change its math, one layout-independent record.

The three published layouts (EAGLE, SpecForge, speculators) spell these differently; the parsers in
`eval_worker.families.eagle3.layouts` translate each into this one record, so the model code has
a single meaning for every switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from eval_worker.drafters.shape import DecoderShape

FeatureNorm = Literal["none", "concat", "per_tap"]


@dataclass(frozen=True)
class Eagle3Config(DecoderShape):
    """One Llama-style decoder layer whose attention reads `cat(embedding, hidden)` (2H wide)."""

    vocab_size: int  # the target's vocabulary (embedding rows, `t2d` length)
    draft_vocab_size: int  # lm_head rows; a draft id d is target id d + d2t[d]
    target_hidden_size: int  # width of one tap; fc is [hidden, taps * target_hidden]
    qk_norm: bool = False  # per-head RMSNorm on q and k (a Qwen3 layer)
    norm_before_residual: bool = False  # the residual is hidden_norm(h), not h
    feature_norm: FeatureNorm = "none"  # RMSNorm on the taps before fc: over the concatenation, or per tap
    logits_from_norm: bool = True  # logits = lm_head(norm(x)); False: lm_head(x)
    feed_normed: bool = False  # later steps read norm(x) instead of x (EAGLE 3.1)
    speculative_tokens: int | None = None  # the layout's own chain length, when it names one
    sliding_window: int | None = None  # attend to the last W positions only (speculators' default layers)
    tied_lm_head: bool = False  # lm_head is embed_tokens (tie_word_embeddings), not a tensor of its own
