"""Offline = live for EAGLE-3: the offline walk's round taus equal a real greedy speculative loop's, where
the tiny target verifies every round - chain and EAGLE trees, with a draft vocab smaller than the
target's, and under every math flag the layouts carry."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.walks import CHAIN, walk_eagle_prompts
from schemas.trees import EagleTreeShape
from testing.eagle3 import eagle3_config, frequent_d2t, random_eagle3, train_eagle3
from testing.eagle3_live_loop import live_eagle3_decode
from testing.live_loop import target_heads
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import EAGLE_LAYER_IDS, TRAIN_TEXTS

TREES = (EagleTreeShape(3, 2, 8), EagleTreeShape(2, 3, 7))
STEPS = 3
FLAGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "speculators-flags": {"norm_before_residual": True, "feature_norm": "per_tap", "feed_normed": True,
                          "qk_norm": True},
    "specforge-raw-logits": {"logits_from_norm": False, "feature_norm": "concat"},
}  # fmt: skip


def trained(target: Any, seqs: Sequences, draft_vocab: int, seed: int, **flags: Any) -> Eagle3Drafter:
    """A briefly trained drafter (accepts often, not always), draft vocab = the most frequent tokens."""
    n = len(TRAIN_TEXTS)
    d2t = frequent_d2t(seqs.token_ids[:n], draft_vocab, target.config.vocab_size)
    cfg = eagle3_config(target.config, draft_vocab_size=draft_vocab)
    drafter = random_eagle3(replace(cfg, **flags), len(EAGLE_LAYER_IDS), seed=seed, d2t=d2t)
    embed, _ = target_heads(target)
    train_eagle3(drafter, seqs.token_ids[:n], seqs.taps[:n], embed, 60)
    return drafter


@pytest.mark.parametrize("flags", FLAGS, ids=list(FLAGS))
def test_offline_walk_equals_the_live_loop(eagle_target: Any, eagle_sequences: Sequences, flags: str) -> None:
    drafter = trained(eagle_target, eagle_sequences, 160, seed=3, **FLAGS[flags])
    embed, _ = target_heads(eagle_target)
    seqs = eagle_sequences
    prompts = [
        PromptFeatures(t, ids.tolist(), n)
        for t, ids, n in zip(seqs.taps, seqs.token_ids, seqs.prompt_lens, strict=True)
    ]
    offline = walk_eagle_prompts(drafter, prompts, embed, steps=STEPS, trees=TREES, cost=DraftCost())
    accepted_more_than_the_bonus = 0
    for p, walked in zip(prompts, offline, strict=True):
        prompt, total = p.token_ids[: p.prompt_len], len(p.token_ids)
        chain = live_eagle3_decode(eagle_target, drafter, prompt, total, EAGLE_LAYER_IDS, steps=STEPS)
        assert chain.token_ids == p.token_ids  # the live loop reproduces the target's greedy response
        assert walked[CHAIN] == chain.round_taus
        for shape in TREES:
            live = live_eagle3_decode(eagle_target, drafter, prompt, total, EAGLE_LAYER_IDS, tree=shape)
            assert live.token_ids == p.token_ids
            assert walked[shape.key] == live.round_taus, shape.key
        accepted_more_than_the_bonus += sum(t > 1 for t in walked[CHAIN])
    assert accepted_more_than_the_bonus > 10  # the drafter is right often enough for the walk to matter


def test_rounds_stop_at_the_response_end_and_count_drafting(eagle_target: Any, eagle_sequences: Sequences) -> None:
    torch.manual_seed(0)
    drafter = random_eagle3(eagle3_config(eagle_target.config), len(EAGLE_LAYER_IDS))
    embed, _ = target_heads(eagle_target)
    seqs = eagle_sequences
    prompt = PromptFeatures(seqs.taps[0], seqs.token_ids[0].tolist(), seqs.prompt_lens[0])
    cost = DraftCost()
    [walked] = walk_eagle_prompts(drafter, [prompt], embed, steps=STEPS, trees=TREES[:1], cost=cost)
    response = len(prompt.token_ids) - prompt.prompt_len
    for taus in walked.values():
        assert response - 1 <= sum(taus) <= response  # the last round scores only the tokens that remain
    assert all(1 <= t <= STEPS + 1 for t in walked[CHAIN])
    assert cost.drafted_blocks == len(walked[CHAIN]) + len(walked[TREES[0].key])


def test_a_round_deeper_than_the_sliding_window_is_refused(eagle_target: Any, eagle_sequences: Sequences) -> None:
    """The window masks the context only: a round whose own nodes would leave it is refused, not drafted."""
    windowed = random_eagle3(replace(eagle3_config(eagle_target.config), sliding_window=65), len(EAGLE_LAYER_IDS))
    embed, _ = target_heads(eagle_target)
    seqs = eagle_sequences
    prompt = PromptFeatures(seqs.taps[0], seqs.token_ids[0].tolist(), seqs.prompt_lens[0])
    deep = EagleTreeShape(1, 70, 72)
    with pytest.raises(ValueError, match=r"deeper than the drafter's sliding window \(65\)"):
        walk_eagle_prompts(windowed, [prompt], embed, steps=STEPS, trees=[deep], cost=DraftCost())
    walk_eagle_prompts(windowed, [prompt], embed, steps=STEPS, trees=[EagleTreeShape(1, 60, 62)], cost=DraftCost())
