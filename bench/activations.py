"""A stand-in for one decoder layer's output, for the benches: no model needs to run."""

from __future__ import annotations

import torch


def activation_like(tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[T, H] residual-stream stand-in: normal values, per-channel scales, 8 massive-activation
    channels (as real decoder layers have), so a codec compresses it as it would real states."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(hidden, generator=gen) * 0.5)  # [H]
    scale[torch.randperm(hidden, generator=gen)[:8]] *= 100.0
    return (torch.randn(tokens, hidden, generator=gen) * scale).to(dtype)  # [T, H]
