"""The reference evaluation: draft every anchor of a sequence, then walk the chain and each DDTree
over those drafts. Walk-driven drafting (`eval_worker.evaluation.walks`) must score the same."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from eval_worker.drafters.batched import draft_anchors
from eval_worker.drafters.model import DFlashDrafter
from eval_worker.evaluation.walks import CHAIN
from eval_worker.scoring.acceptance import DraftLookup, chain_round_taus, tree_round_taus
from eval_worker.scoring.summary import round_taus
from schemas.report import PromptEval


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
