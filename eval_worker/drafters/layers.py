"""The building blocks both drafter families share: Qwen3's RoPE tables and rotation, RMSNorm and the
SwiGLU MLP (parameter names as in their checkpoints)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Qwen3 default RoPE tables for integer `positions` [...] -> cos, sin [..., head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions[..., None].float() * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., S, D] rotated by cos/sin broadcastable to it (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: variance in float32, weight applied in the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x [..., dim] normalised."""
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj: nn.Linear = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj: nn.Linear = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj: nn.Linear = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., H] -> [..., H]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
