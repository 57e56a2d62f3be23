"""Draft every anchor of one sequence in a few batched passes.

The context keys/values depend only on the taps (the drafter never updates its context), so each
layer's k/v of `hidden_norm(fc(taps))` is computed once for the whole sequence; anchors are then
processed in chunks, block j attending to context positions < s_j and to its own B tokens.
Same drafts as `drafter.draft_block` run once per anchor, up to float noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.drafter import DFlashDrafter, apply_rope, rope_cos_sin


@dataclass(frozen=True)
class ContextKV:
    """Per drafter layer: keys (RoPE'd at positions 0..T-1) and values [nkv, T, D]."""

    keys: list[Tensor]
    values: list[Tensor]


@dataclass(frozen=True)
class AnchorDrafts:
    """Drafts for a set of anchors s: greedy ids [A, B-1]; top-k log-softmax values and ids [A, B-1, k]."""

    anchors: tuple[int, ...]
    greedy: Tensor
    top_logprobs: Tensor
    top_ids: Tensor

    def _row(self, s: int) -> int:
        index = s - self.anchors[0]
        if not 0 <= index < len(self.anchors) or self.anchors[index] != s:
            index = self.anchors.index(s)
        return index

    def greedy_drafts(self, s: int) -> list[int]:
        return [int(t) for t in self.greedy[self._row(s)].tolist()]

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        row = self._row(s)
        return self.top_logprobs[row], self.top_ids[row]


def context_kv(drafter: DFlashDrafter, taps: Tensor) -> ContextKV:
    """taps [T, K*H] -> per layer k_norm(k_proj(ctx)) RoPE'd at 0..T-1 and v_proj(ctx), [nkv, T, D]."""
    cfg = drafter.cfg
    t, d, nkv = taps.shape[0], cfg.head_dim, cfg.num_key_value_heads
    ctx = drafter.project_context(taps)  # [T, H]
    cos, sin = rope_cos_sin(torch.arange(t, device=taps.device), d, cfg.rope_theta, ctx.dtype)  # [T, D]
    keys, values = [], []
    for layer in drafter.blocks():
        attn = layer.self_attn
        k = attn.k_norm(attn.k_proj(ctx).view(t, nkv, d)).transpose(0, 1)  # [nkv, T, D]
        keys.append(apply_rope(k, cos, sin))
        values.append(attn.v_proj(ctx).view(t, nkv, d).transpose(0, 1))
    return ContextKV(keys, values)


def block_logits(
    drafter: DFlashDrafter,
    kv: ContextKV,
    anchor_ids: Tensor,
    anchors: Tensor,
    embed_tokens: Tensor,
    lm_head: Tensor,
) -> Tensor:
    """anchor_ids [m] = t[s], anchors [m] = s -> draft logits [m, B-1, V] (differentiable)."""
    cfg = drafter.cfg
    m, b, d = anchors.shape[0], cfg.block_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    g = nh // nkv
    c = int(anchors.max()) if m else 0  # context positions any block of the chunk may see
    mask_id = torch.full((m, b - 1), cfg.mask_token_id, dtype=torch.long, device=anchors.device)
    x = F.embedding(torch.cat([anchor_ids[:, None], mask_id], dim=1), embed_tokens)  # [m, B, H]
    positions = anchors[:, None] + torch.arange(b, device=anchors.device)  # [m, B]
    cos, sin = rope_cos_sin(positions, d, cfg.rope_theta, x.dtype)  # [m, B, D]
    cos, sin = cos[:, None], sin[:, None]  # [m, 1, B, D]
    visible = torch.arange(c, device=anchors.device)[None, :] < anchors[:, None]  # [m, C]
    ctx_bias = torch.zeros(m, 1, 1, c, dtype=x.dtype, device=x.device)
    ctx_bias = ctx_bias.masked_fill(~visible[:, None, None, :], float("-inf"))  # [m, 1, 1, C]
    for i, layer in enumerate(drafter.blocks()):
        attn = layer.self_attn
        residual = x
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(m, b, nh, d)).transpose(1, 2)  # [m, nh, B, D]
        kb = attn.k_norm(attn.k_proj(h).view(m, b, nkv, d)).transpose(1, 2)  # [m, nkv, B, D]
        vb = attn.v_proj(h).view(m, b, nkv, d).transpose(1, 2)
        q, kb = apply_rope(q, cos, sin), apply_rope(kb, cos, sin)
        q = q.reshape(m, nkv, g * b, d)  # query head j*g+r uses kv head j (HF repeat_kv order)
        kc, vc = kv.keys[i][:, :c], kv.values[i][:, :c]  # [nkv, C, D]
        scores_ctx = (q @ kc.transpose(-1, -2)) * d**-0.5 + ctx_bias  # [m, nkv, g*B, C]
        scores_blk = (q @ kb.transpose(-1, -2)) * d**-0.5  # [m, nkv, g*B, B]
        probs = torch.softmax(torch.cat([scores_ctx, scores_blk], dim=-1), dim=-1, dtype=torch.float32)
        probs = probs.to(q.dtype)
        out = probs[..., :c] @ vc + probs[..., c:] @ vb  # [m, nkv, g*B, D]
        out = out.view(m, nh, b, d).transpose(1, 2).reshape(m, b, nh * d)
        x = residual + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return F.linear(drafter.norm(x)[:, 1:], lm_head)  # [m, B-1, V]


@torch.no_grad()
def draft_anchors(
    drafter: DFlashDrafter,
    taps: Tensor,
    token_ids: Tensor,
    anchors: Sequence[int],
    embed_tokens: Tensor,
    lm_head: Tensor,
    *,
    top_k: int,
    chunk_size: int = 16,
) -> AnchorDrafts:
    """taps [T, K*H], token_ids [T] -> drafts for each anchor s (context = taps[:s]).

    Returns greedy drafts and the top-`top_k` float32 log-softmax values (over the full vocab)."""
    device = taps.device
    kv = context_kv(drafter, taps)
    anchor_t = torch.tensor(list(anchors), dtype=torch.long, device=device)
    token_ids = token_ids.to(device)
    greedy, top_lp, top_ids = [], [], []
    for start in range(0, len(anchors), chunk_size):
        chunk = anchor_t[start : start + chunk_size]
        logits = block_logits(drafter, kv, token_ids[chunk], chunk, embed_tokens, lm_head)
        greedy.append(logits.argmax(dim=-1).cpu())
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [m, B-1, V]
        values, ids = logprobs.topk(min(top_k, logprobs.shape[-1]), dim=-1)
        top_lp.append(values.cpu())
        top_ids.append(ids.cpu())
    b1, k = drafter.cfg.block_size - 1, min(top_k, lm_head.shape[0])
    return AnchorDrafts(
        anchors=tuple(int(s) for s in anchors),
        greedy=torch.cat(greedy) if greedy else torch.empty(0, b1, dtype=torch.long),
        top_logprobs=torch.cat(top_lp) if top_lp else torch.empty(0, b1, k),
        top_ids=torch.cat(top_ids) if top_ids else torch.empty(0, b1, k, dtype=torch.long),
    )
