"""Walk-driven drafting scores exactly what drafting every anchor and walking does, for less work."""

from __future__ import annotations

from typing import Any

import pytest

from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN, walk_prompts
from testing.all_anchor import all_anchor_taus
from testing.live_loop import target_heads
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import random_drafter, small_config

BUDGETS = (1, 3, 6, 40)  # 40 > the vocab slice a tree can use at block size 4: depth-capped


def _all_anchor_taus(drafter: DFlashDrafter, p: PromptFeatures, embed: Any, head: Any) -> dict[int, list[int]]:
    return all_anchor_taus(drafter, p.taps, p.token_ids, p.prompt_len, BUDGETS, embed, head)


def _features(sequences: Sequences) -> list[PromptFeatures]:
    return [
        PromptFeatures(taps, ids.tolist(), n)
        for taps, ids, n in zip(sequences.taps, sequences.token_ids, sequences.prompt_lens, strict=True)
    ]


@pytest.mark.parametrize("max_blocks", [1, 5, 64])
def test_trained_drafter_walks_equal_the_all_anchor_path(
    trained_drafter: DFlashDrafter, sequences: Sequences, target: Any, max_blocks: int
) -> None:
    embed, head = target_heads(target)
    prompts = _features(sequences)
    cost = DraftCost()
    walked = walk_prompts(
        trained_drafter,
        prompts,
        embed,
        head,
        tree_budgets=BUDGETS,
        top_k=max(BUDGETS),
        cost=cost,
        max_blocks=max_blocks,
    )
    expected = [_all_anchor_taus(trained_drafter, p, embed, head) for p in prompts]
    assert walked == expected
    rounds = sum(len(t) for taus in expected for t in taus.values())
    assert sum(sum(t) for t in expected[0].values()) > len(expected[0])  # the drafter accepts something
    assert 0 < cost.drafted_blocks <= rounds  # a walk that reaches a drafted block reuses it
    assert cost.lm_head_rows <= rounds * (trained_drafter.cfg.block_size - 1)  # no more than the live loops


def test_random_drafter_walks_equal_the_all_anchor_path(sequences: Sequences, target: Any) -> None:
    cfg = small_config(
        hidden_size=target.config.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        block_size=6,
        mask_token_id=target.config.vocab_size - 1,
    )
    drafter = random_drafter(cfg, 3, seed=5)
    embed, head = target_heads(target)
    prompts = _features(sequences)
    walked = walk_prompts(drafter, prompts, embed, head, tree_budgets=BUDGETS, top_k=max(BUDGETS), cost=DraftCost())
    assert walked == [_all_anchor_taus(drafter, p, embed, head) for p in prompts]


def test_a_chain_drafts_about_one_anchor_in_tau(
    trained_drafter: DFlashDrafter, sequences: Sequences, target: Any
) -> None:
    embed, head = target_heads(target)
    prompts = _features(sequences)
    cost = DraftCost()
    walked = walk_prompts(trained_drafter, prompts, embed, head, tree_budgets=(), top_k=1, cost=cost)
    rounds = sum(len(taus[CHAIN]) for taus in walked)
    all_anchor_blocks = sum(len(p.token_ids) - 1 - p.prompt_len for p in prompts)
    assert cost.drafted_blocks == rounds < all_anchor_blocks / 1.5


def test_lm_head_rows_stop_at_the_first_mismatch(sequences: Sequences, target: Any) -> None:
    """Chain only: a drafter that never matches projects one position per round."""
    cfg = small_config(
        hidden_size=target.config.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        block_size=6,
        mask_token_id=target.config.vocab_size - 1,
    )
    drafter = random_drafter(cfg, 3, seed=5)
    embed, head = target_heads(target)
    cost = DraftCost()
    [prompt] = _features(sequences)[:1]
    [walked] = walk_prompts(drafter, [prompt], embed, head, tree_budgets=(), top_k=1, cost=cost)
    s, rows = prompt.prompt_len, 0
    for tau in walked[CHAIN]:  # each matched position, plus the one that missed (if the reference went on)
        remaining = min(cfg.block_size - 1, len(prompt.token_ids) - 1 - s)
        rows += (tau - 1) + (1 if tau - 1 < remaining else 0)
        s += tau
    assert cost.drafted_blocks == len(walked[CHAIN])
    assert cost.lm_head_rows == rows < len(walked[CHAIN]) * (cfg.block_size - 1)
