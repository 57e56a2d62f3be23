"""Constants and small builders shared by the eval-worker tests."""

from __future__ import annotations

from typing import Any

import torch

from eval_worker.families.dflash.config import DFlashConfig
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.model import ModelInfo

LAYER_IDS = (1, 3, 5)  # includes the last decoder layer (5 of 6), which needs the hook
EAGLE_LAYER_IDS = (1, 5, 8)  # EAGLE-3's defaults for 12 layers: layer inputs 2, 6, 9
BLOCK_SIZE = 4
NEW_TOKENS = 32
TRAIN_TEXTS = [
    "def fib(n):",
    "The quick brown fox",
    "import numpy as np",
    "Question: what is",
    "class Stack:",
    "for i in range(10):",
]
HELD_OUT_TEXTS = ["print(x.sum(axis=0))", "Answer: Paris is"]


def random_drafter(cfg: DFlashConfig, num_taps: int, seed: int = 0) -> DFlashDrafter:
    """An untrained drafter with non-trivial norm weights (so a wrong norm placement shows)."""
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg, num_taps)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            elif "fc" in name:
                p.normal_(0.0, 0.3)
    return drafter.eval()


def small_config(**overrides: Any) -> DFlashConfig:
    """A 2-layer GQA drafter config of hidden 32 (4 heads of 8, 2 kv heads)."""
    fields: dict[str, Any] = {
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 48,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "block_size": 5,
        "mask_token_id": 99,
        "target_layer_ids": (1, 2, 4),
        "num_target_layers": 6,
    }
    fields.update(overrides)
    return DFlashConfig(**fields)


def small_target(num_layers: int = 6, hidden: int = 32, vocab: int = 100) -> ModelInfo:
    return ModelInfo(
        name="small",
        fingerprint="small-fp",
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        max_position_embeddings=512,
        dtype="float32",
        capture_layers=[],
    )
