"""The key test: offline tau from one cached forward == tau of a live speculative loop, round for round."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN, walk_prompts
from testing.all_anchor import all_anchor_taus
from testing.live_loop import live_decode, target_heads
from testing.taps import target_forward
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import BLOCK_SIZE, LAYER_IDS

TREE_BUDGET = 6


def _offline(target: Any, drafter: DFlashDrafter, token_ids: list[int], prompt_len: int) -> tuple[list[int], list[int]]:
    """Chain and DDTree taus from ONE forward over prompt + the target's greedy response, walk-driven
    as the evaluator runs them (and equal to drafting every anchor, the reference path)."""
    taps = target_forward(target, torch.tensor([token_ids]), LAYER_IDS).taps[0]
    embed, head = target_heads(target)
    prompt = PromptFeatures(taps, token_ids, prompt_len)
    [walked] = walk_prompts(
        drafter, [prompt], embed, head, tree_budgets=(TREE_BUDGET,), top_k=TREE_BUDGET, cost=DraftCost()
    )
    assert walked == all_anchor_taus(drafter, taps, token_ids, prompt_len, (TREE_BUDGET,), embed, head)
    return walked[CHAIN], walked[TREE_BUDGET]


@pytest.fixture(scope="module")
def offline_and_live(
    target: Any, trained_drafter: DFlashDrafter, sequences: Sequences
) -> list[tuple[tuple[list[int], list[int]], Any, Any, list[int]]]:
    out = []
    for ids, prompt_len in zip(sequences.token_ids, sequences.prompt_lens, strict=True):
        reference = ids.tolist()
        prompt = reference[:prompt_len]
        chain = live_decode(target, trained_drafter, prompt, len(reference), LAYER_IDS)
        tree = live_decode(target, trained_drafter, prompt, len(reference), LAYER_IDS, budget=TREE_BUDGET)
        out.append((_offline(target, trained_drafter, reference, prompt_len), chain, tree, reference))
    return out


def test_trained_drafter_is_sometimes_right(offline_and_live: list[Any]) -> None:
    means = [sum(chain) / len(chain) for (chain, _), *_ in offline_and_live]
    mean_tau = sum(means) / len(means)
    print(f"offline chain tau of the tiny trained drafter: {mean_tau:.3f} per prompt {means}")
    assert mean_tau > 1.3
    all_rounds = [t for (chain, _), *_ in offline_and_live for t in chain]
    assert 1 in all_rounds and BLOCK_SIZE in all_rounds  # both misses and full blocks occur


def test_live_loop_generates_the_targets_greedy_text(offline_and_live: list[Any]) -> None:
    for _, chain, tree, reference in offline_and_live:
        assert chain.token_ids == reference
        assert tree.token_ids == reference


def test_offline_chain_taus_equal_live_chain_taus(offline_and_live: list[Any]) -> None:
    for (offline_chain, _), live_chain, _, _ in offline_and_live:
        assert offline_chain == live_chain.round_taus


def test_offline_tree_taus_equal_live_tree_taus(offline_and_live: list[Any]) -> None:
    for (_, offline_tree), _, live_tree, _ in offline_and_live:
        assert offline_tree == live_tree.round_taus
