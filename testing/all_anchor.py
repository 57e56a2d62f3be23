"""The reference evaluation: draft every anchor of a sequence in a few batched passes, then walk the
chain and each DDTree over those drafts. Walk-driven drafting (`eval_worker.evaluation.walks`) must
score the same, and the tests hold it to that. `block_logits` also drives the tiny trainer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.families.dflash.drafter import ContextKV, DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN
from eval_worker.scoring.acceptance import DraftLookup, chain_round_taus, tree_round_taus
from eval_worker.scoring.summary import round_taus
from schemas.report import PromptEval


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


def all_anchor_taus(
    drafter: DFlashDrafter,
    taps: Tensor,
    token_ids: Sequence[int],
    prompt_len: int,
    tree_budgets: Sequence[int],
    embed_tokens: Tensor,
    lm_head: Tensor,
) -> dict[int, list[int]]:
    """{CHAIN: round taus, b: round taus for each budget}, drafting at every anchor."""
    total, b = len(token_ids), drafter.cfg.block_size
    anchors = range(prompt_len, max(prompt_len, total - 1))
    top_k = max(tree_budgets, default=1)
    drafts = draft_anchors(drafter, taps, torch.tensor(list(token_ids)), anchors, embed_tokens, lm_head, top_k=top_k)
    out = {CHAIN: chain_round_taus(token_ids, prompt_len, b, drafts)}
    return out | {budget: tree_round_taus(token_ids, prompt_len, b, drafts, budget) for budget in tree_budgets}


def score_prompt(
    prompt_id: str,
    drafts: DraftLookup,
    token_ids: Sequence[int],
    prompt_len: int,
    block_size: int,
    tree_budgets: Sequence[int],
) -> PromptEval:
    """Chain and per-budget tree round taus of one prompt from its per-anchor drafts."""
    return PromptEval(
        prompt_id=prompt_id,
        prompt_len=prompt_len,
        num_tokens=len(token_ids),
        chain=round_taus(chain_round_taus(token_ids, prompt_len, block_size, drafts)),
        trees={b: round_taus(tree_round_taus(token_ids, prompt_len, block_size, drafts, b)) for b in tree_budgets},
    )
