"""The published DFlash drafter (parameter names match its checkpoints).

A non-causal Qwen3-style stack that attends over `hidden_norm(fc(taps))` of the target and a block
`[anchor, MASK, ...]`; it borrows the target's `embed_tokens` and `lm_head`, passed in.
`draft_block` is the literal one-round forward; `eval_worker.batched` drafts many anchors at once.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval_worker.drafter_config import DrafterConfig


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: variance in float32, weight applied in the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = d
        self.q_proj: nn.Linear = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj: nn.Linear = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj: nn.Linear = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj: nn.Linear = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm: RMSNorm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm: RMSNorm = RMSNorm(d, cfg.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj: nn.Linear = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj: nn.Linear = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj: nn.Linear = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.self_attn: Attention = Attention(cfg)
        self.mlp: MLP = MLP(cfg)
        self.input_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DFlashDrafter(nn.Module):
    """State-dict keys: fc, hidden_norm, layers.{i}.*, norm - 11 * num_layers + 3 tensors, no biases."""

    def __init__(self, cfg: DrafterConfig, num_taps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_taps = num_taps
        self.fc: nn.Linear = nn.Linear(num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_layers))
        self.norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def blocks(self) -> list[DrafterLayer]:
        return [cast(DrafterLayer, layer) for layer in self.layers]

    def project_context(self, taps: Tensor) -> Tensor:
        return self.hidden_norm(self.fc(taps))  # [..., K*H] -> [..., H]


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


def draft_block(
    drafter: DFlashDrafter, taps: Tensor, block_ids: Tensor, embed_tokens: Tensor, lm_head: Tensor
) -> Tensor:
    """One drafting round exactly as published: taps [C, K*H] of positions < s, block_ids [B]
    (`[t[s], MASK, ...]`) -> draft logits [B-1, V] for positions s+1..s+B-1."""
    cfg = drafter.cfg
    c, b, d = taps.shape[0], block_ids.shape[0], cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    ctx = drafter.project_context(taps)  # [C, H]
    x = F.embedding(block_ids, embed_tokens)  # [B, H]
    cos, sin = rope_cos_sin(torch.arange(c + b, device=taps.device), d, cfg.rope_theta, x.dtype)  # [C+B, D]
    for layer in drafter.blocks():
        attn = layer.self_attn
        residual = x
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, nh, d)).transpose(0, 1)  # [nh, B, D]
        k = torch.cat([attn.k_proj(ctx), attn.k_proj(h)]).view(c + b, nkv, d)
        k = attn.k_norm(k).transpose(0, 1)  # [nkv, C+B, D]
        v = torch.cat([attn.v_proj(ctx), attn.v_proj(h)]).view(c + b, nkv, d).transpose(0, 1)
        q, k = apply_rope(q, cos[c:], sin[c:]), apply_rope(k, cos, sin)
        k = k.repeat_interleave(nh // nkv, dim=0)  # [nh, C+B, D]
        v = v.repeat_interleave(nh // nkv, dim=0)
        out = F.scaled_dot_product_attention(q, k, v, scale=d**-0.5)  # no mask: [nh, B, D]
        x = residual + attn.o_proj(out.transpose(0, 1).reshape(b, nh * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return F.linear(drafter.norm(x)[1:], lm_head)  # [B-1, V]
