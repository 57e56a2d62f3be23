"""The published DFlash drafter as `nn.Module`s (parameter names match its checkpoints).

A non-causal Qwen3-style stack. A block `[t[s], MASK, ...]` of B tokens attends to itself and to
the context `hidden_norm(fc(taps))` of positions < s; the drafter borrows the target's
`embed_tokens` and `lm_head`, passed in. The context never changes while drafting, so its keys and
values are computed once per sequence (`context_kv`) and any number of blocks, of one sequence or
of several stacked (`stack_kv`), are drafted against them in one `forward`. `forward`
stops before `lm_head`, so callers project only the positions they need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval_worker.drafters.layers import MLP, RMSNorm, apply_rope, rope_cos_sin
from eval_worker.families.dflash.config import DFlashConfig


@dataclass(frozen=True)
class ContextKV:
    """Per drafter layer: keys (RoPE'd at positions 0..T-1) and values of the context, [nkv, T, D]."""

    keys: list[Tensor]
    values: list[Tensor]


class Attention(nn.Module):
    """Qwen3 attention (q/k norms, GQA) of a block over the context and itself, unmasked in the block."""

    def __init__(self, cfg: DFlashConfig) -> None:
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

    def context_kv(self, ctx: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """ctx [T, H] -> keys (RoPE'd with cos/sin [T, D]) and values, both [nkv, T, D]."""
        t, nkv, d = ctx.shape[0], self.num_kv_heads, self.head_dim
        k = self.k_norm(self.k_proj(ctx).view(t, nkv, d)).transpose(0, 1)  # [nkv, T, D]
        return apply_rope(k, cos, sin), self.v_proj(ctx).view(t, nkv, d).transpose(0, 1)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, kc: Tensor, vc: Tensor, ctx_bias: Tensor) -> Tensor:
        """h [m, B, H] (normed block states), cos/sin [m, 1, B, D], context kc/vc [nkv, C, D] (or one
        context per block, [m, nkv, C, D]) and
        ctx_bias [m, 1, 1, C] (-inf where a block may not see the context) -> [m, B, H]."""
        m, b, _ = h.shape
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        g = nh // nkv
        q = self.q_norm(self.q_proj(h).view(m, b, nh, d)).transpose(1, 2)  # [m, nh, B, D]
        kb = self.k_norm(self.k_proj(h).view(m, b, nkv, d)).transpose(1, 2)  # [m, nkv, B, D]
        vb = self.v_proj(h).view(m, b, nkv, d).transpose(1, 2)
        q, kb = apply_rope(q, cos, sin), apply_rope(kb, cos, sin)
        q = q.reshape(m, nkv, g * b, d)  # query head j*g+r uses kv head j (HF repeat_kv order)
        c = kc.shape[-2]
        scores_ctx = (q @ kc.transpose(-1, -2)) * d**-0.5 + ctx_bias  # [m, nkv, g*B, C]
        scores_blk = (q @ kb.transpose(-1, -2)) * d**-0.5  # [m, nkv, g*B, B]
        probs = torch.softmax(torch.cat([scores_ctx, scores_blk], dim=-1), dim=-1, dtype=torch.float32)
        probs = probs.to(q.dtype)
        out = probs[..., :c] @ vc + probs[..., c:] @ vb  # [m, nkv, g*B, D]
        return self.o_proj(out.view(m, nh, b, d).transpose(1, 2).reshape(m, b, nh * d))


class DFlashLayer(nn.Module):
    """Pre-norm attention and MLP with residuals."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn: Attention = Attention(cfg)
        self.mlp: MLP = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kc: Tensor, vc: Tensor, ctx_bias: Tensor) -> Tensor:
        """x [m, B, H] -> [m, B, H] (see `Attention.forward` for the rest)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kc, vc, ctx_bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """State-dict keys: fc, hidden_norm, layers.{i}.*, norm - 11 * num_layers + 3 tensors, no biases."""

    def __init__(self, cfg: DFlashConfig, num_taps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_taps = num_taps
        self.fc: nn.Linear = nn.Linear(num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def blocks(self) -> list[DFlashLayer]:
        """The decoder layers, typed."""
        return [cast(DFlashLayer, layer) for layer in self.layers]

    def context_kv(self, taps: Tensor) -> ContextKV:
        """taps [T, K*H] (the target's layers, concatenated) -> every layer's context keys and values."""
        ctx = self.hidden_norm(self.fc(taps))  # [T, H]
        positions = torch.arange(taps.shape[0], device=taps.device)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, ctx.dtype)  # [T, D]
        pairs = [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.blocks()]
        return ContextKV([k for k, _ in pairs], [v for _, v in pairs])

    def forward(
        self, block_ids: Tensor, anchors: Tensor, kv: ContextKV, embed_tokens: Tensor, ctx_index: Tensor | None = None
    ) -> Tensor:
        """block_ids [m, B] placed at positions anchors[i] + 0..B-1, each seeing the context positions
        < anchors[i] -> the final normed states [m, B-1, H] of positions 1..B-1 (differentiable).

        `kv` is one sequence's context ([nkv, T, D] per layer), or with `ctx_index` [m] several
        sequences' stacked by `stack_kv` ([P, nkv, T, D]), block i reading sequence ctx_index[i]."""
        m, b = block_ids.shape
        c = int(anchors.max()) if m else 0  # context positions any block may see
        x = F.embedding(block_ids, embed_tokens)  # [m, B, H]
        positions = anchors[:, None] + torch.arange(b, device=anchors.device)  # [m, B]
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)  # [m, B, D]
        cos, sin = cos[:, None], sin[:, None]  # [m, 1, B, D]
        visible = torch.arange(c, device=anchors.device)[None, :] < anchors[:, None]  # [m, C]
        ctx_bias = torch.zeros(m, 1, 1, c, dtype=x.dtype, device=x.device)
        ctx_bias = ctx_bias.masked_fill(~visible[:, None, None, :], float("-inf"))  # [m, 1, 1, C]
        for i, layer in enumerate(self.blocks()):
            kc, vc = kv.keys[i][..., :c, :], kv.values[i][..., :c, :]  # [nkv, C, D] or [P, nkv, C, D]
            if ctx_index is not None:
                kc, vc = kc[ctx_index], vc[ctx_index]  # [m, nkv, C, D]: each block its own sequence
            x = layer(x, cos, sin, kc, vc, ctx_bias)
        return self.norm(x)[:, 1:]  # [m, B-1, H]


def stack_kv(parts: list[ContextKV]) -> ContextKV:
    """Several sequences' contexts stacked ([P, nkv, T_max, D] per layer, zero-padded past each one's
    end, which no block sees); `forward` picks each block's sequence with `ctx_index`."""
    longest = max(p.keys[0].shape[1] for p in parts)

    def stacked(tensors: list[Tensor]) -> Tensor:
        return torch.stack([F.pad(t, (0, 0, 0, longest - t.shape[1])) for t in tensors])

    layers = range(len(parts[0].keys))
    return ContextKV(
        [stacked([p.keys[i] for p in parts]) for i in layers], [stacked([p.values[i] for p in parts]) for i in layers]
    )


def draft_block(
    drafter: DFlashDrafter, taps: Tensor, block_ids: Tensor, embed_tokens: Tensor, lm_head: Tensor
) -> Tensor:
    """One drafting round as published: taps [C, K*H] of positions < s, block_ids [B]
    (`[t[s], MASK, ...]`) -> draft logits [B-1, V] for positions s+1..s+B-1."""
    anchor = torch.tensor([taps.shape[0]], device=taps.device)
    return F.linear(drafter(block_ids[None], anchor, drafter.context_kv(taps), embed_tokens)[0], lm_head)
