"""An MTP head as `nn.Module`s: its norms and projection, and one decoder block built from transformers'
own class for the target's architecture (attention and MoE as the target computes them).

Position t reads (h_t, token t+1): h_t the target's last layer through its final norm (what vLLM hands an
MTP head), its output normed is both the logits' input and the hidden state the next step reads. On
target features one causal pass gives every position's cached attention states and output (`prefill`):
the live loop's context, and the first draft of a round anchored at t+1. Later steps (`step`) read the
head's own output, each node seeing the context before its anchor, the round's earlier nodes and itself.
The block's attention reads its cache through `_Visible`, which hands it those states in one tensor and
keeps the node's own; `attention_mask` says which of them each node sees.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval_worker.families.mtp.layouts import MtpLayout

_PREFILL_ROWS = 256  # query rows of the causal pass per chunk


@dataclass(frozen=True)
class MtpContext:
    """One sequence on target features: the block's cached states of positions 0..T-2 (whatever its
    attention caches: keys and values, or MLA's latents), each [1, heads, T-1, D], and the head's
    normed output there [T-1, H]; out[s-1] is the root of a round anchored at s."""

    first: Tensor
    second: Tensor
    out: Tensor


class _Visible:
    """The cache a block's attention reads: earlier states prepended to the new ones, which it keeps."""

    def __init__(self, first: list[Tensor], second: list[Tensor]) -> None:
        self._first, self._second = first, second
        self.new: tuple[Tensor, Tensor] | None = None

    def update(self, first: Tensor, second: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """What transformers' attention calls: the new states -> all states it attends to."""
        self.new = (first, second)
        return torch.cat([*self._first, first], dim=-2), torch.cat([*self._second, second], dim=-2)


def block_config(layout: MtpLayout, hf_config: Any) -> Any:
    """The target config as the head's block is built from it: eager attention (its additive masks), and
    for hybrids a full-attention layer at index 0, as vLLM builds the MTP layer."""
    cfg = copy.deepcopy(hf_config)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the plain loop over experts, as a standalone module runs it
    if getattr(cfg, "layer_types", None):  # hybrids: the head is a full-attention layer
        cfg.layer_types = ["full_attention", *list(cfg.layer_types)[1:]]
    return cfg


class MtpDrafter(nn.Module):
    """Keys: norm_embed, norm_hidden, proj, norm_out, block.* (the layout maps the published names)."""

    def __init__(self, layout: MtpLayout, hf_config: Any) -> None:
        super().__init__()
        layer_cls, norm_cls, rotary_cls = layout.classes()
        cfg = block_config(layout, hf_config)
        h, eps = int(cfg.hidden_size), float(cfg.rms_norm_eps)
        self.layout = layout
        self.norm_embed: nn.Module = norm_cls(h, eps=eps)
        self.norm_hidden: nn.Module = norm_cls(h, eps=eps)
        self.proj: nn.Linear = nn.Linear(2 * h, h, bias=False)
        self.block: nn.Module = layer_cls(cfg, layout.block_index(int(hf_config.num_hidden_layers)))
        self.norm_out: nn.Module = norm_cls(h, eps=eps)
        self.rotary: nn.Module = rotary_cls(config=cfg)
        params = inspect.signature(self.block.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def inputs(self, embeds: Tensor, hidden: Tensor, positions: Tensor) -> Tensor:
        """Token embeddings and hidden states [..., S, H] at positions [..., S] -> the block's input."""
        if self.layout.zero_position_0:  # DeepSeek: position 0 has no previous token to predict from
            embeds = torch.where(positions[..., None] == 0, torch.zeros_like(embeds), embeds)
        return self.proj(torch.cat([self.norm_embed(embeds), self.norm_hidden(hidden)], dim=-1))

    def run_block(self, x: Tensor, positions: Tensor, visible: _Visible, mask: Tensor) -> Tensor:
        """The block over x [B, S, H] at positions [B, S], attending to `visible`'s states under the
        additive mask [B, 1, S, N] -> its normed output [B, S, H]."""
        cos, sin = self.rotary(x, positions)
        kwargs = {self._cache_arg: visible}
        y = self.block(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin), **kwargs)
        if isinstance(y, tuple):
            y = y[0]
        out: Tensor = self.norm_out(y)
        return out

    def prefill(self, hidden: Tensor, token_ids: Tensor, embed_tokens: Tensor) -> MtpContext:
        """hidden [T, H] (the target's normed last layer) and token ids [T] -> the context on target features."""
        t = hidden.shape[0] - 1
        positions = torch.arange(t, device=hidden.device)
        x = self.inputs(F.embedding(token_ids[1:], embed_tokens), hidden[:t], positions)[None]
        firsts: list[Tensor] = []
        seconds: list[Tensor] = []
        outs = []
        for lo in range(0, t, _PREFILL_ROWS):
            hi = min(lo + _PREFILL_ROWS, t)
            rows = torch.arange(lo, hi, device=x.device)[:, None]
            cols = torch.arange(hi, device=x.device)[None]
            mask = torch.zeros(hi - lo, hi, dtype=x.dtype, device=x.device).masked_fill(cols > rows, float("-inf"))
            visible = _Visible(firsts, seconds)
            outs.append(self.run_block(x[:, lo:hi], positions[None, lo:hi], visible, mask[None, None]))
            assert visible.new is not None
            firsts, seconds = [*firsts, visible.new[0]], [*seconds, visible.new[1]]
        return MtpContext(torch.cat(firsts, dim=-2), torch.cat(seconds, dim=-2), torch.cat(outs, dim=1)[0])

    def step(
        self,
        hidden: Tensor,
        tokens: Tensor,
        positions: Tensor,
        context: tuple[Tensor, Tensor],
        context_visible: Tensor,
        chain: tuple[Tensor, Tensor],
        embed_tokens: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One node per round, m rounds: hidden [m, H] (the previous output), target token ids [m] at
        positions [m], over the rounds' contexts [m, heads, C, D] (visible where `context_visible`
        [m, C]) and their earlier nodes [m, heads, N, D] -> outputs [m, H] and the nodes' cached states."""
        m = hidden.shape[0]
        x = self.inputs(F.embedding(tokens, embed_tokens)[:, None], hidden[:, None], positions[:, None])
        c, n = context[0].shape[-2], chain[0].shape[-2]
        mask = torch.zeros(m, 1, 1, c + n + 1, dtype=x.dtype, device=x.device)
        mask[..., :c] = mask[..., :c].masked_fill(~context_visible[:, None, None, :], float("-inf"))
        visible = _Visible([context[0], chain[0]], [context[1], chain[1]])
        out = self.run_block(x, positions[:, None], visible, mask)
        assert visible.new is not None
        return out[:, 0], visible.new
