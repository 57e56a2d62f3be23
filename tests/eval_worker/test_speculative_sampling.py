"""The live speculative sampling loop (`testing/speculative_sampling.py`) against independent ground truth:
at T = 0 it is the greedy live loops round for round; at T > 0 with greedy drafting, the path lemma holds
run by run (the offline greedy chain walk over a run's own output counts exactly its rounds), and the
offline walk over responses sampled from the target alone estimates the live tau without bias."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.sampling import sample_token, seeded_generator
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.walks import CHAIN as EAGLE_CHAIN
from eval_worker.families.eagle3.walks import walk_eagle_prompts
from schemas.sampling import SamplingParams
from testing.all_anchor import all_anchor_taus
from testing.eagle3 import eagle3_config, frequent_d2t, random_eagle3, train_eagle3
from testing.eagle3_live_loop import live_eagle3_decode
from testing.live_loop import live_decode, target_heads
from testing.speculative_sampling import speculative_sample, verify_drafts
from testing.taps import target_forward
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import BLOCK_SIZE, EAGLE_LAYER_IDS, LAYER_IDS, NEW_TOKENS, TRAIN_TEXTS

K = BLOCK_SIZE - 1  # DFlash drafts a block of BLOCK_SIZE: K tokens; EAGLE-3 drafts K chain steps too
# Scaling lm_head by 20 multiplies every logit by 20: the target at T is the random-init target at T/20,
# whose next-token distribution is peaked as a trained LM's is (mean top probability ~0.9 on its greedy
# path), so at T = 1 a greedy draft is accepted about a third of the time: neither never nor always.
PEAK = 20.0
RUNS = 40  # per family, cycling through prompts and settings, each with its own seed
SETTINGS = (
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=1.0, top_p=0.95),
    SamplingParams(temperature=0.2),
    SamplingParams(temperature=0.2, top_p=0.95),
)


def peaked(model_dir: Path) -> Any:
    """A fresh copy of the target with its lm_head scaled by PEAK (the shared fixtures stay as they are)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(PEAK)
    return model


@pytest.fixture(scope="module")
def peaked_target(tiny_target: Path) -> Any:
    return peaked(tiny_target)


@pytest.fixture(scope="module")
def peaked_eagle_target(eagle_target_dir: Path) -> Any:
    return peaked(eagle_target_dir)


@pytest.fixture(scope="module")
def eagle_drafter(eagle_target: Any, eagle_sequences: Sequences) -> Eagle3Drafter:
    """A briefly trained EAGLE-3 drafter with a draft vocab of 160 (the most frequent tokens)."""
    n, seqs = len(TRAIN_TEXTS), eagle_sequences
    d2t = frequent_d2t(seqs.token_ids[:n], 160, eagle_target.config.vocab_size)
    drafter = random_eagle3(eagle3_config(eagle_target.config, draft_vocab_size=160), 3, seed=3, d2t=d2t)
    train_eagle3(drafter, seqs.token_ids[:n], seqs.taps[:n], target_heads(eagle_target)[0], 60, depth=K)
    return drafter


def prompt_of(seqs: Sequences, i: int) -> list[int]:
    p = i % len(seqs.token_ids)
    return seqs.token_ids[p][: seqs.prompt_lens[p]].tolist()


def test_temperature_zero_is_the_greedy_dflash_loop(
    target: Any, trained_drafter: DFlashDrafter, sequences: Sequences
) -> None:
    for i in range(len(sequences.token_ids)):
        prompt = prompt_of(sequences, i)
        live = live_decode(target, trained_drafter, prompt, len(prompt) + NEW_TOKENS, LAYER_IDS)
        run = speculative_sample(target, trained_drafter, prompt, NEW_TOKENS, LAYER_IDS, SamplingParams(), k=K)
        assert run.token_ids == live.token_ids == sequences.token_ids[i].tolist()
        assert run.round_taus == live.round_taus


def test_temperature_zero_is_the_greedy_eagle3_loop(
    eagle_target: Any, eagle_drafter: Eagle3Drafter, eagle_sequences: Sequences
) -> None:
    accepted = 0
    for i in range(len(eagle_sequences.token_ids)):
        prompt = prompt_of(eagle_sequences, i)
        live = live_eagle3_decode(
            eagle_target, eagle_drafter, prompt, len(prompt) + NEW_TOKENS, EAGLE_LAYER_IDS, steps=K
        )
        run = speculative_sample(
            eagle_target, eagle_drafter, prompt, NEW_TOKENS, EAGLE_LAYER_IDS, SamplingParams(), k=K
        )
        assert run.token_ids == live.token_ids == eagle_sequences.token_ids[i].tolist()
        assert run.round_taus == live.round_taus
        accepted += sum(run.accepted)
    assert accepted > 10  # the drafter is right often enough for the comparison to mean something


Walk = Callable[[list[int], int], list[int]]  # (token ids, prompt_len) -> the offline chain's round taus


def dflash_walk(target: Any, drafter: DFlashDrafter) -> Walk:
    embed, lm_head = target_heads(target)

    def walk(ids: list[int], prompt_len: int) -> list[int]:
        taps = target_forward(target, torch.tensor([ids]), LAYER_IDS).taps[0]
        return all_anchor_taus(drafter, taps, ids, prompt_len, (), embed, lm_head)[CHAIN]

    return walk


def eagle3_walk(target: Any, drafter: Eagle3Drafter) -> Walk:
    embed, _ = target_heads(target)

    def walk(ids: list[int], prompt_len: int) -> list[int]:
        taps = target_forward(target, torch.tensor([ids]), EAGLE_LAYER_IDS).taps[0]
        features = PromptFeatures(taps, ids, prompt_len)
        return walk_eagle_prompts(drafter, [features], embed, steps=K, trees=(), cost=DraftCost())[0][EAGLE_CHAIN]

    return walk


@torch.no_grad()
def sampled_responses(target: Any, prompt: list[int], settings: list[SamplingParams]) -> list[list[int]]:
    """prompt + NEW_TOKENS tokens sampled from the target alone (no drafter anywhere), one response per
    setting (each with its own seed), all of them in one batch."""
    rows, generators = [list(prompt) for _ in settings], [seeded_generator(p.seed or 0, "cpu") for p in settings]
    for _ in range(NEW_TOKENS):
        logits = target(input_ids=torch.tensor(rows), use_cache=False).logits[:, -1]
        for row, row_logits, params, generator in zip(rows, logits, settings, generators, strict=True):
            row.append(sample_token(row_logits, params, generator))
    return rows


def mean_tau(taus: list[int]) -> float:
    return sum(taus) / len(taus)


def family_case(family: str, request: pytest.FixtureRequest) -> tuple[Any, Any, Sequences, tuple[int, ...], Walk]:
    """The peaked target, drafter, greedy sequences, taps and offline chain walk of one family."""
    if family == "dflash":
        target, drafter = request.getfixturevalue("peaked_target"), request.getfixturevalue("trained_drafter")
        return target, drafter, request.getfixturevalue("sequences"), LAYER_IDS, dflash_walk(target, drafter)
    target, drafter = request.getfixturevalue("peaked_eagle_target"), request.getfixturevalue("eagle_drafter")
    return target, drafter, request.getfixturevalue("eagle_sequences"), EAGLE_LAYER_IDS, eagle3_walk(target, drafter)


@pytest.mark.parametrize("family", ["dflash", "eagle3"])
def test_path_lemma_live_rounds_are_the_offline_walk_over_the_output(
    family: str, request: pytest.FixtureRequest
) -> None:
    target, drafter, seqs, layers, offline = family_case(family, request)
    settings = [SETTINGS[i % len(SETTINGS)].model_copy(update={"seed": i}) for i in range(RUNS)]
    live_taus, left_greedy = [], 0
    for i, params in enumerate(settings):
        prompt = prompt_of(seqs, i)
        run = speculative_sample(target, drafter, prompt, NEW_TOKENS, layers, params, k=K)
        assert len(run.token_ids) == len(prompt) + NEW_TOKENS
        assert offline(run.token_ids, len(prompt)) == run.round_taus, f"run {i}"  # the lemma, exactly
        live_taus.append(mean_tau(run.round_taus))
        left_greedy += run.token_ids != seqs.token_ids[i % len(seqs.token_ids)].tolist()
    assert left_greedy > RUNS // 4  # sampling, not the greedy path again
    # independently: responses sampled from the target alone, same prompts and settings, other seeds
    offline_taus = []
    for p in range(len(seqs.token_ids)):
        runs = range(p, RUNS, len(seqs.token_ids))
        prompt = prompt_of(seqs, p)
        alone = sampled_responses(target, prompt, [settings[i].model_copy(update={"seed": 10_000 + i}) for i in runs])
        offline_taus += [mean_tau(offline(ids, len(prompt))) for ids in alone]
    live, off = statistics.fmean(live_taus), statistics.fmean(offline_taus)
    se = (statistics.variance(live_taus) / RUNS + statistics.variance(offline_taus) / RUNS) ** 0.5
    assert 1.2 < live < K + 0.8  # drafts accepted sometimes, not always
    assert abs(live - off) <= 3 * se, (live, off, se)


@pytest.mark.parametrize("drafting", ["greedy", "probabilistic"])
def test_one_position_is_lossless_and_accepts_at_the_overlap(drafting: str) -> None:
    """Standard rejection sampling at one position: the committed token is distributed as p_T whatever
    q is, and a draft x ~ q is accepted with probability sum(min(p_T, q)) (one-hot q: p_T(x))."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=0.7, seed=0)
    p = torch.softmax(logits[0] / 0.7, dim=-1)
    q = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])  # a draft distribution unlike p_T
    generator, n = seeded_generator(1, "cpu"), 20_000
    counts, accepted = torch.zeros(5), 0
    for _ in range(n):
        x = 1 if drafting == "greedy" else int(torch.multinomial(q, 1, generator=generator))
        verdict = verify_drafts(logits, [x], None if drafting == "greedy" else q[None], params, generator)
        counts[verdict.tokens[0]] += 1
        accepted += verdict.accepted
    rate = float(p[1]) if drafting == "greedy" else float(torch.minimum(p, q).sum())
    assert abs(accepted / n - rate) < 4 * (rate * (1 - rate) / n) ** 0.5
    assert torch.allclose(counts / n, p, atol=4 * (0.25 / n) ** 0.5)


@pytest.mark.parametrize("family", ["dflash", "eagle3"])
def test_probabilistic_drafting_is_greedy_at_zero_and_a_seed_reproduces_it(
    family: str, request: pytest.FixtureRequest
) -> None:
    target, drafter, seqs, layers, _ = family_case(family, request)
    prompt = prompt_of(seqs, 0)
    greedy = speculative_sample(target, drafter, prompt, NEW_TOKENS, layers, SamplingParams(), k=K)
    zero = speculative_sample(
        target, drafter, prompt, NEW_TOKENS, layers, SamplingParams(), k=K, draft_sampling="probabilistic"
    )
    assert zero == greedy
    sampled = [
        speculative_sample(
            target, drafter, prompt, NEW_TOKENS, layers, SETTINGS[1].model_copy(update={"seed": seed}), k=K,
            draft_sampling="probabilistic",
        )
        for seed in (5, 5, 6)
    ]  # fmt: skip
    assert sampled[0] == sampled[1] != sampled[2]
    assert all(len(run.token_ids) == len(prompt) + NEW_TOKENS and min(run.accepted) >= 0 for run in sampled)
    assert sum(sum(run.accepted) for run in sampled) > 0
