"""Probabilistic drafting scored offline against live speculative sampling.

The path lemma (REFERENCE section 15): given a live run's output, each drafted position was accepted
with probability min(1, q/p_T), independently; so on each run's own output the live accepted count
minus the dynamic program's expected count has mean 0. Thousands of seeded runs of the live loop
(`testing/speculative_sampling.py`, vLLM's rejection rule) hold the offline numbers to that, for DFlash
and EAGLE-3. At temperature 0 the offline numbers are the greedy chain walk's, and the target's
logits the offline code rebuilds from its last layer are the forward's own.

The target is a 3-layer random Qwen3 with its lm_head scaled by SCALE: sampling it at T = 1 is sampling
the random model at T = 1/SCALE, peaked (its top token holds most of the mass), so a sampled response
mostly follows the greedy one and leaves it now and then. The drafters are trained to memorise the
greedy responses of the training prompts: they draft well on the greedy path and poorly off it, so
acceptance is neither ~0 nor ~all (mean round tau ~2 of K + 1 = 4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from cache_server.capture.tiny_model import MIN_VOCAB, build_tiny_model
from cache_server.sampling import target_probs
from eval_worker.evaluation.probabilistic import (
    PAST_END,
    acceptance,
    draft_token_probs,
    path_target_probs,
    target_logits,
)
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures, TargetNorm
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.probabilistic import expected_dflash_prompts
from eval_worker.families.dflash.walks import CHAIN, walk_prompts
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.probabilistic import expected_eagle3_prompts
from eval_worker.families.eagle3.walks import walk_eagle_prompts
from schemas.report import ExpectedRounds
from schemas.sampling import GREEDY, SamplingParams
from testing.eagle3 import eagle3_config, frequent_d2t, random_eagle3, train_eagle3
from testing.live_loop import target_heads
from testing.speculative_sampling import SampledRun, speculative_sample
from testing.taps import target_forward
from testing.tiny_trainer import Sequences, TinyTrainer, make_sequences, tiny_drafter_config
from tests.eval_worker.helpers import HELD_OUT_TEXTS, TRAIN_TEXTS

LAYERS = (0, 1, 2)  # every layer of the 3-layer target: the drafters' taps, the last one also p_T's
SCALE = 48.0
K = 3  # drafts per round: DFlash block size K + 1, EAGLE-3 K steps
NEW_TOKENS = 12
RUNS = 2000
DRAFT_VOCAB = 160  # EAGLE-3: fewer than the target's MIN_VOCAB ids, so some path tokens have q = 0

Expected = Callable[[Sequence[PromptFeatures], Sequence[Tensor], Sequence[SamplingParams]], list[ExpectedRounds]]


@dataclass(frozen=True)
class Peaked:
    """The peaked target, its greedy responses to the training and held-out prompts, and the two drafters
    trained on the training prompts' responses."""

    target: Any
    sequences: Sequences
    dflash: DFlashDrafter
    eagle3: Eagle3Drafter

    @property
    def final_norm(self) -> TargetNorm:
        norm = self.target.model.norm
        return TargetNorm(norm.weight.detach(), float(norm.variance_epsilon))

    def expected(self, family: str, cost: DraftCost) -> Expected:
        """The family's offline expected rounds over prompts, their last layers and sampling."""
        embed, head = target_heads(self.target)
        if family == "dflash":
            return lambda p, last, s: expected_dflash_prompts(
                self.dflash, p, last, s, embed, head, self.final_norm, cost=cost
            )
        return lambda p, last, s: expected_eagle3_prompts(
            self.eagle3, p, last, s, embed, head, self.final_norm, steps=K, cost=cost
        )


@pytest.fixture(scope="module")
def peaked(tmp_path_factory: pytest.TempPathFactory) -> Peaked:
    path: Path = build_tiny_model(tmp_path_factory.mktemp("peaked"), layers=3, hidden=32, vocab=MIN_VOCAB, seed=0)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(SCALE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [list(tokenizer(t)["input_ids"]) for t in TRAIN_TEXTS + HELD_OUT_TEXTS]
    sequences = make_sequences(target, prompts, LAYERS, 16)
    n = len(TRAIN_TEXTS)
    train = Sequences(sequences.token_ids[:n], sequences.taps[:n], sequences.prompt_lens[:n])
    embed, head = target_heads(target)
    torch.manual_seed(0)
    dflash = DFlashDrafter(tiny_drafter_config(target.config, LAYERS, block_size=K + 1), len(LAYERS))
    TinyTrainer(dflash, train, embed, head, lr=3e-3, seed=0).run(600)
    d2t = frequent_d2t(train.token_ids, DRAFT_VOCAB, target.config.vocab_size)
    eagle3 = random_eagle3(eagle3_config(target.config, draft_vocab_size=DRAFT_VOCAB), len(LAYERS), seed=3, d2t=d2t)
    train_eagle3(eagle3, train.token_ids, train.taps, embed, 200, depth=K)
    return Peaked(target, sequences, dflash.eval(), eagle3)


def _split(passed: Tensor) -> tuple[Tensor, Tensor]:
    """Taps [..., 3H] of LAYERS -> (the drafters' taps, the last layer [..., H])."""
    return passed, passed[..., -passed.shape[-1] // len(LAYERS) :]


def test_target_logits_from_the_last_layer_are_the_forwards(peaked: Peaked) -> None:
    """Bit for bit in fp32: lm_head(final RMSNorm(last decoder layer)) is what transformers computes."""
    _, head = target_heads(peaked.target)
    for ids in peaked.sequences.token_ids:
        forward = target_forward(peaked.target, ids[None], LAYERS)
        _, last = _split(forward.taps[0])
        rebuilt = target_logits(last, head, peaked.final_norm)
        torch.testing.assert_close(rebuilt, forward.logits[0], rtol=0, atol=0)


def test_path_target_probs_are_each_next_tokens_probability(peaked: Peaked) -> None:
    _, head = target_heads(peaked.target)
    setting = SamplingParams(temperature=1.5, top_k=20, top_p=0.9, min_p=0.01, seed=0)
    for ids, n in zip(peaked.sequences.token_ids, peaked.sequences.prompt_lens, strict=True):
        forward = target_forward(peaked.target, ids[None], LAYERS)
        _, last = _split(forward.taps[0])
        got = path_target_probs(last, ids.tolist(), n, setting, head, peaked.final_norm, DraftCost())
        want = [float(target_probs(forward.logits[0, i], setting)[ids[i + 1]]) for i in range(n, len(ids) - 1)]
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-7)
        ones = path_target_probs(last, ids.tolist(), n, GREEDY, head, peaked.final_norm, DraftCost())
        assert ones.tolist() == [1.0] * (len(ids) - 1 - n)  # greedy: the path is the target's argmax


def test_acceptance_reads_each_cells_position() -> None:
    q = torch.tensor([[0.5, 0.2], [0.1, 0.9], [0.3, 0.4]], dtype=torch.float64)  # cells (anchor row, draft)
    p = torch.tensor([0.25, 0.5, 0.0], dtype=torch.float64)  # p_T of positions prompt_len + 1, + 2, + 3
    want = [[1.0, 0.4], [0.2, 0.0], [0.0, 0.0]]  # min(1, q / p(row + draft)); p = 0 or past the end: 0
    torch.testing.assert_close(acceptance(q, p), torch.tensor(want, dtype=torch.float64))


def test_draft_token_probs_at_a_temperature_greedy_and_outside_the_vocab() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0], [2.0, 0.0, 1.0], [0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens = torch.tensor([2, 0, 1, PAST_END])
    temperature = torch.tensor([0.5, 0.0, 0.0, 1.0])
    want = [float((logits[0] / 0.5).softmax(-1)[2]), 1.0, 1.0, 0.0]
    torch.testing.assert_close(draft_token_probs(logits, tokens, temperature), torch.tensor(want))


def _greedy_features(peaked: Peaked) -> tuple[list[PromptFeatures], list[Tensor]]:
    seqs = peaked.sequences
    prompts = [
        PromptFeatures(t, ids.tolist(), n)
        for t, ids, n in zip(seqs.taps, seqs.token_ids, seqs.prompt_lens, strict=True)
    ]
    return prompts, [_split(t)[1] for t in seqs.taps]


@pytest.mark.parametrize("family", ["dflash", "eagle3"])
def test_temperature_zero_is_the_greedy_chain_walk(peaked: Peaked, family: str) -> None:
    prompts, last = _greedy_features(peaked)
    embed, head = target_heads(peaked.target)
    cost = DraftCost()
    got = peaked.expected(family, cost)(prompts, last, [GREEDY] * len(prompts))
    if family == "dflash":
        walked = [
            w[CHAIN]
            for w in walk_prompts(peaked.dflash, prompts, embed, head, tree_budgets=(), top_k=1, cost=DraftCost())
        ]
    else:
        walked = [
            w["chain"] for w in walk_eagle_prompts(peaked.eagle3, prompts, embed, steps=K, trees=(), cost=DraftCost())
        ]
    for expected, taus in zip(got, walked, strict=True):
        assert expected.rounds == len(taus)
        assert expected.accepted == sum(taus) - len(taus)
        assert expected.mean_tau == pytest.approx(sum(taus) / len(taus), abs=1e-12)
    rounds = {t for taus in walked for t in taus}
    assert {1, K + 1} <= rounds  # misses (held-out prompts) and full rounds (training prompts) both occur
    anchors = sum(len(p.token_ids) - 1 - p.prompt_len for p in prompts)
    assert cost.drafted_blocks == anchors  # every anchor drafted once


def _live_runs(peaked: Peaked, drafter: DFlashDrafter | Eagle3Drafter, setting: SamplingParams) -> list[SampledRun]:
    """RUNS seeded live runs over the training prompts in turn, drafts sampled from q."""
    prompts = [
        ids[:n].tolist() for ids, n in zip(peaked.sequences.token_ids, peaked.sequences.prompt_lens, strict=True)
    ]
    prompts = prompts[: len(TRAIN_TEXTS)]
    return [
        speculative_sample(
            peaked.target,
            drafter,
            prompts[i % len(prompts)],
            NEW_TOKENS,
            LAYERS,
            setting.model_copy(update={"seed": i}),
            k=K,
            draft_sampling="probabilistic",
        )
        for i in range(RUNS)
    ]


def _offline(
    peaked: Peaked, runs: Sequence[SampledRun], expected: Expected, setting: SamplingParams
) -> list[ExpectedRounds]:
    """The dynamic program on each run's own output: one target forward per batch of equal-length outputs."""
    out: dict[int, ExpectedRounds] = {}
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, run in enumerate(runs):
        by_shape.setdefault((len(run.token_ids), run.prompt_len), []).append(i)
    for (_, prompt_len), members in by_shape.items():
        for lo in range(0, len(members), 128):
            part = members[lo : lo + 128]
            ids = torch.tensor([runs[i].token_ids for i in part])
            taps, last = _split(target_forward(peaked.target, ids, LAYERS).taps)
            features = [PromptFeatures(taps[r], ids[r].tolist(), prompt_len) for r in range(len(part))]
            got = expected(features, list(last), [setting] * len(part))
            out |= dict(zip(part, got, strict=True))
    return [out[i] for i in range(len(runs))]


def _assert_mean_zero(name: str, differences: np.ndarray) -> None:
    mean, se = float(differences.mean()), float(differences.std(ddof=1) / np.sqrt(len(differences)))
    print(f"{name}: mean difference {mean:+.4f}, standard error {se:.4f} ({mean / se:+.2f} se)")
    assert se > 0
    assert abs(mean) <= 3 * se


# DFlash reads the target's (scaled) lm_head, so at T = 1 its q is as peaked as p_T and nearly every cell's
# acceptance is 0 or 1; at T = 2 about a fifth of the cells lie between, where the ratio test matters.
SETTINGS = {
    "dflash-T2-top_k20": ("dflash", SamplingParams(temperature=2.0, top_k=20, seed=0)),
    "eagle3-T1-top_p0.95": ("eagle3", SamplingParams(temperature=1.0, top_p=0.95, seed=0)),
}


@pytest.mark.parametrize(("family", "setting"), list(SETTINGS.values()), ids=list(SETTINGS))
def test_expected_rounds_match_live_speculative_sampling(peaked: Peaked, family: str, setting: SamplingParams) -> None:
    drafter = peaked.dflash if family == "dflash" else peaked.eagle3
    runs = _live_runs(peaked, drafter, setting)
    offline = _offline(peaked, runs, peaked.expected(family, DraftCost()), setting)
    live_accepted = np.array([sum(r.round_taus) - r.rounds for r in runs], dtype=np.float64)
    live_tau = np.array([sum(r.round_taus) / r.rounds for r in runs])
    expected_accepted = np.array([e.accepted for e in offline])
    expected_tau = np.array([e.mean_tau for e in offline], dtype=np.float64)
    print(
        f"{family} at {setting.setting}, {RUNS} runs: mean round tau live {live_tau.mean():.4f}, offline "
        f"{expected_tau.mean():.4f}; accepted per run live {live_accepted.mean():.4f}, "
        f"offline {expected_accepted.mean():.4f}"
    )
    _assert_mean_zero(f"{family} accepted (live - expected on its path)", live_accepted - expected_accepted)
    _assert_mean_zero(f"{family} mean round tau (live - expected on its path)", live_tau - expected_tau)
    assert 1.3 < live_tau.mean() < K + 1 - 0.3  # acceptance is neither ~0 nor ~all: the test has power
    assert float(np.std(expected_tau)) > 0.05  # the paths differ in what they allow
