"""Draft every anchor of one sequence in a few batched passes of the drafter.

The context keys/values depend only on the taps (the drafter never updates its context), so they
are computed once for the whole sequence; anchors are then drafted in chunks, block j attending to
context positions < s_j and to its own B tokens. Same drafts as `draft_block` run once per anchor,
up to float noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.drafters.model import ContextKV, DFlashDrafter


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
        """The greedy chain drafted at anchor s."""
        return [int(t) for t in self.greedy[self._row(s)].tolist()]

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        """Top-k log-probs and ids [B-1, k] drafted at anchor s."""
        row = self._row(s)
        return self.top_logprobs[row], self.top_ids[row]


def block_logits(
    drafter: DFlashDrafter,
    kv: ContextKV,
    anchor_ids: Tensor,
    anchors: Tensor,
    embed_tokens: Tensor,
    lm_head: Tensor,
) -> Tensor:
    """anchor_ids [m] = t[s], anchors [m] = s -> draft logits [m, B-1, V] of blocks `[t[s], MASK, ...]`."""
    m, b = anchors.shape[0], drafter.cfg.block_size
    masks = torch.full((m, b - 1), drafter.cfg.mask_token_id, dtype=torch.long, device=anchors.device)
    return F.linear(drafter(torch.cat([anchor_ids[:, None], masks], dim=1), anchors, kv, embed_tokens), lm_head)


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
    kv = drafter.context_kv(taps)
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
