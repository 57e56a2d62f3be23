"""Config keys every drafter family shares, and the check that no other key is ignored.

A loader honours each key it reads, lists the ones that do not change a drafter's math here or beside
its layout, and refuses any other key by name: a key that may change the math is never ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_worker.errors import CheckpointRefused

# HF fields that do not change a drafter's math at evaluation (bookkeeping, training, generation).
INERT = {
    "architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "initializer_range", "max_position_embeddings", "attention_dropout",
    "max_window_layers", "_name_or_path", "name_or_path", "_attn_implementation", "_attn_implementation_autoset",
    "output_attentions", "output_hidden_states", "return_dict", "embed_requires_grad",
    "auto_map",  # names remote code; nothing here runs it
}  # fmt: skip


def check_keys(raw: Mapping[str, Any], known: set[str], where: str) -> None:
    """CheckpointRefused naming the keys of `raw` outside `known`."""
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CheckpointRefused(
            f"{where} config keys {unknown} are not known to this loader; a key that may change the drafter's "
            "math is never ignored"
        )
