"""The EAGLE-3 drafter as `nn.Module`s; parameter names are the EAGLE (SafeAILab) checkpoint keys.

One Llama-style decoder layer ("midlayer") whose attention reads `cat(input_layernorm(embed(token)),
hidden_norm(h))`, 2H wide, and attends causally to the drafter's own keys and values of earlier
positions. The feature at position i is paired with token i+1. On target features
(`h = fc(taps)`) one causal pass over a sequence gives every position's keys and values and the
drafter's output there (`prefill`): the live loop's context, and the first draft of a round
anchored at i+1. Later steps (`step`) feed the drafter's own output `x` back as `h`, each node
seeing the context before its anchor, its tree ancestors and itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval_worker.drafters.layers import MLP, RMSNorm, apply_rope, rope_cos_sin
from eval_worker.families.eagle3.config import Eagle3Config

_PREFILL_ROWS = 256  # query rows of the causal pass per chunk (bounds the [heads, rows, T] scores)


@dataclass(frozen=True)
class Eagle3Context:
    """One sequence on target features: keys/values [nkv, T-1, D] of positions 0..T-2 (RoPE'd) and the
    drafter's output x [T-1, H] there; x[s-1] is the root of a round anchored at s."""

    keys: Tensor
    values: Tensor
    roots: Tensor


@dataclass(frozen=True)
class NodeBatch:
    """m rounds, n new nodes each: what `step` reads besides the nodes themselves.

    keys/values: the rounds' contexts [m, nkv, C, D] (or [P, nkv, C, D] with `which` [m] picking one
    per round); `anchors` [m]: context positions < anchors[i] are visible to round i;
    tree_keys/tree_values [m, nkv, N, D] of earlier nodes with `tree_visible` [m, n, N]."""

    keys: Tensor
    values: Tensor
    which: Tensor | None
    anchors: Tensor
    tree_keys: Tensor
    tree_values: Tensor
    tree_visible: Tensor


class Eagle3Attention(nn.Module):
    """Llama attention over 2H-wide inputs (optionally with Qwen3's per-head q/k norms), GQA, no bias."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj: nn.Linear = nn.Linear(2 * h, self.num_heads * d, bias=False)
        self.k_proj: nn.Linear = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.v_proj: nn.Linear = nn.Linear(2 * h, self.num_kv_heads * d, bias=False)
        self.o_proj: nn.Linear = nn.Linear(self.num_heads * d, h, bias=False)
        if cfg.qk_norm:
            self.q_norm: RMSNorm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm: RMSNorm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [..., S, 2H] -> q [..., nh, S, D], k and v [..., nkv, S, D]; q and k RoPE'd with cos/sin [..., 1, S, D]."""
        lead, s = x.shape[:-2], x.shape[-2]
        q = self.q_proj(x).view(*lead, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, s, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor]]) -> Tensor:
        """q [..., nh, S, D] over several (keys, values [..., nkv, N, D], additive bias [..., 1|nkv, S, N]) in
        one softmax (float32) -> o_proj output [..., S, H]."""
        *lead, nh, s, d = q.shape
        nkv = self.num_kv_heads
        g = nh // nkv
        q = q.reshape(*lead, nkv, g * s, d)  # query head j*g+r uses kv head j (HF repeat_kv order)
        # bias rows are per query position; the g heads sharing a kv head are stacked along the rows
        scores = [(q @ k.transpose(-1, -2)) * d**-0.5 + torch.cat([bias] * g, dim=-2) for k, _, bias in parts]
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1, dtype=torch.float32).to(q.dtype)
        widths = [k.shape[-2] for k, _, _ in parts]
        out = sum(p @ v for p, (_, v, _) in zip(probs.split(widths, dim=-1), parts, strict=True))
        assert isinstance(out, Tensor)
        out = out.reshape(*lead, nh, s, d).transpose(-2, -3).reshape(*lead, s, nh * d)
        return self.o_proj(out)


class Eagle3Layer(nn.Module):
    """The midlayer: hidden_norm / input_layernorm on the two halves, attention, MLP, two residuals."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.self_attn: Eagle3Attention = Eagle3Attention(cfg)
        self.mlp: MLP = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.hidden_norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def inputs(self, embeds: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """Token embeddings and hidden states [..., H] -> attention input [..., 2H] and residual [..., H]."""
        normed = self.hidden_norm(h)
        residual = normed if self.cfg.norm_before_residual else h
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, residual: Tensor, attn: Tensor) -> Tensor:
        """The two residual additions around the MLP."""
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(nn.Module):
    """Keys: fc, midlayer.*, norm, lm_head, d2t (+ embed_tokens, input_norm or fc_norm.{i} when present)."""

    d2t: Tensor  # [Vd] int64 buffer: draft id d is target id d + d2t[d]

    def __init__(self, cfg: Eagle3Config, num_taps: int, *, has_embed: bool) -> None:
        super().__init__()
        self.cfg, self.num_taps = cfg, num_taps
        self.fc: nn.Linear = nn.Linear(num_taps * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        if cfg.feature_norm == "concat":
            self.input_norm: RMSNorm = RMSNorm(num_taps * cfg.target_hidden_size, cfg.rms_norm_eps)
        elif cfg.feature_norm == "per_tap":
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(num_taps))
        self.midlayer: Eagle3Layer = Eagle3Layer(cfg)
        self.norm: RMSNorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head: nn.Linear = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        if has_embed:
            self.embed_tokens: nn.Embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.has_embed = has_embed

    def project(self, taps: Tensor) -> Tensor:
        """taps [..., K*Ht] -> fc input features normed as the layout asks -> [..., H]."""
        if self.cfg.feature_norm == "concat":
            taps = self.input_norm(taps)
        elif self.cfg.feature_norm == "per_tap":
            chunks = taps.chunk(self.num_taps, dim=-1)
            taps = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(taps)

    def logits(self, x: Tensor) -> Tensor:
        """Drafter outputs [..., H] -> draft-vocab logits [..., Vd]."""
        return self.lm_head(self.norm(x) if self.cfg.logits_from_norm else x)

    def feedback(self, x: Tensor) -> Tensor:
        """What the next step reads as its hidden state: x, or norm(x) under EAGLE 3.1's norm_output."""
        return self.norm(x) if self.cfg.feed_normed else x

    def to_target(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocab ids -> target ids (d + d2t[d])."""
        return draft_ids + self.d2t[draft_ids]

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, dtype)
        return cos.unsqueeze(-3), sin.unsqueeze(-3)  # [..., 1, S, D]: broadcast over heads

    def _outside_window(self, cols: Tensor, rows: Tensor) -> Tensor:
        """Which context positions `cols` a query at position `rows` does not see under a sliding window
        (a round's own nodes are always inside it: `step` refuses a round deeper than the window)."""
        w = self.cfg.sliding_window
        return cols <= rows - w if w is not None else torch.zeros_like(cols, dtype=torch.bool)

    def prefill(self, taps: Tensor, token_ids: Tensor, embed_tokens: Tensor) -> Eagle3Context:
        """taps [T, K*Ht] and token ids [T] of one sequence -> its context on target features."""
        t = taps.shape[0] - 1
        x, residual = self.midlayer.inputs(F.embedding(token_ids[1:], embed_tokens), self.project(taps[:t]))
        cos, sin = self._rope(torch.arange(t, device=taps.device), x.dtype)
        q, k, v = self.midlayer.self_attn.qkv(x, cos, sin)  # [nh|nkv, T-1, D]
        out = []
        for lo in range(0, t, _PREFILL_ROWS):
            hi = min(lo + _PREFILL_ROWS, t)
            rows = torch.arange(lo, hi, device=taps.device)[:, None]
            cols = torch.arange(hi, device=taps.device)[None]
            causal = torch.zeros(hi - lo, hi, dtype=x.dtype, device=x.device)
            causal = causal.masked_fill((cols > rows) | self._outside_window(cols, rows), float("-inf"))
            out.append(self.midlayer.self_attn.attend(q[:, lo:hi], [(k[:, :hi], v[:, :hi], causal[None])]))
        return Eagle3Context(k, v, self.midlayer.finish(residual, torch.cat(out)))

    def step(
        self, hidden: Tensor, tokens: Tensor, positions: Tensor, batch: NodeBatch, embed_tokens: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """n nodes per round, hidden [m, n, H] (their parents' feedback) and target token ids [m, n], all at
        positions [m] -> outputs x [m, n, H] and the nodes' keys and values [m, nkv, n, D]."""
        m, n, _ = hidden.shape
        w = self.cfg.sliding_window
        if w is not None and int((positions - batch.anchors).max()) >= w:  # the window masks context only
            raise ValueError(f"a round deeper than the drafter's sliding window ({w}): its own nodes would leave it")
        x, residual = self.midlayer.inputs(F.embedding(tokens, embed_tokens), hidden)
        cos, sin = self._rope(positions[:, None].expand(m, n), x.dtype)  # [m, 1, n, D]
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(x, cos, sin)
        kc, vc = batch.keys, batch.values
        if batch.which is not None:
            kc, vc = kc[batch.which], vc[batch.which]
        c = kc.shape[-2]
        cols = torch.arange(c, device=x.device)[None, :]
        hidden_ctx = (cols >= batch.anchors[:, None]) | self._outside_window(cols, positions[:, None])  # [m, C]
        ctx_bias = torch.zeros(m, 1, n, c, dtype=x.dtype, device=x.device)
        ctx_bias = ctx_bias.masked_fill(hidden_ctx[:, None, None, :], float("-inf"))
        tree_bias = torch.zeros(batch.tree_visible.shape, dtype=x.dtype, device=x.device)
        tree_bias = tree_bias.masked_fill(~batch.tree_visible, float("-inf"))[:, None]  # [m, 1, n, N]
        self_bias = torch.full((n, n), float("-inf"), dtype=x.dtype, device=x.device).fill_diagonal_(0.0)
        parts = [(kc, vc, ctx_bias), (batch.tree_keys, batch.tree_values, tree_bias), (k, v, self_bias[None, None])]
        return self.midlayer.finish(residual, attn.attend(q, parts)), k, v
