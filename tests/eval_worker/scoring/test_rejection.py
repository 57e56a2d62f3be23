"""The dynamic program of probabilistic drafting against brute force: every accept/reject outcome of
every (anchor, position) cell enumerated, each walked by the greedy walk of `acceptance.py` and
weighted by its probability. With accept probabilities 0 or 1 it is the greedy chain walk itself."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from torch import Tensor

from eval_worker.scoring.acceptance import chain_round_taus
from eval_worker.scoring.rejection import accepted_length_probs, expected_rounds, remaining


class _Drafts:
    """A `DraftLookup` of fixed greedy chains per anchor."""

    def __init__(self, drafts: dict[int, list[int]]) -> None:
        self.drafts = drafts

    def greedy_drafts(self, s: int) -> list[int]:
        return self.drafts[s]

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError("chains only")


def _brute_force(accept: np.ndarray) -> tuple[float, float, float]:
    """E[rounds], E[accepted], E[mean round tau] over all 2^(A*K) outcomes of the cells: each outcome is
    a set of greedy drafts (right where the cell accepts, wrong elsewhere) walked by the greedy walk."""
    a, k = accept.shape
    prompt_len = 3
    token_ids = list(range(prompt_len + a + 1))  # T = prompt_len + A + 1: anchors prompt_len .. T-2
    rounds = accepted = mean_tau = 0.0
    for outcome in itertools.product((False, True), repeat=a * k):
        hits = np.array(outcome).reshape(a, k)
        weight = float(np.prod(np.where(hits, accept, 1.0 - accept)))
        if weight == 0.0:
            continue
        anchors = range(prompt_len, prompt_len + a)
        drafts = {s: [s + 1 + j if hits[s - prompt_len, j] else -1 for j in range(k)] for s in anchors}
        taus = chain_round_taus(token_ids, prompt_len, k + 1, _Drafts(drafts))
        rounds += weight * len(taus)
        accepted += weight * (sum(taus) - len(taus))
        mean_tau += weight * sum(taus) / len(taus)
    return rounds, accepted, mean_tau


@pytest.mark.parametrize(("anchors", "depth", "seed"), [(1, 3, 0), (4, 3, 1), (6, 2, 2), (3, 4, 3), (5, 3, 4)])
def test_dynamic_program_equals_brute_force(anchors: int, depth: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    accept = rng.uniform(size=(anchors, depth))
    accept[rng.uniform(size=accept.shape) < 0.2] = 1.0  # sure accepts and rejects mixed in
    accept[rng.uniform(size=accept.shape) < 0.1] = 0.0
    got = expected_rounds(accept)
    rounds, accepted, mean_tau = _brute_force(accept)
    assert got.rounds == pytest.approx(rounds, abs=1e-12)
    assert got.accepted == pytest.approx(accepted, abs=1e-12)
    assert got.mean_tau == pytest.approx(mean_tau, abs=1e-12)


def test_round_lengths_are_a_distribution_that_ignores_cells_past_the_end() -> None:
    accept = np.full((4, 3), 0.5)
    accept[3, 1:] = 7.0  # past the response's end: never read
    lengths = accepted_length_probs(accept, remaining(4, 3))
    np.testing.assert_allclose(lengths.sum(axis=1), 1.0)
    np.testing.assert_allclose(lengths[0], [0.5, 0.25, 0.125, 0.125])
    np.testing.assert_allclose(lengths[2], [0.5, 0.25, 0.25, 0.0])  # two tokens remain
    np.testing.assert_allclose(lengths[3], [0.5, 0.5, 0.0, 0.0])  # one remains: accepted or not, then the end


@pytest.mark.parametrize("seed", range(20))
def test_sure_outcomes_reduce_to_the_greedy_chain_walk(seed: int) -> None:
    """a = [draft == reference token]: the temperature-0 limit is the greedy walk, number for number."""
    rnd = random.Random(seed)
    prompt_len, block = rnd.randint(1, 4), rnd.randint(2, 6)
    total = prompt_len + rnd.randint(1, 30)
    token_ids = [rnd.randrange(3) for _ in range(total)]  # three tokens: drafts often match
    drafts = {s: [rnd.randrange(3) for _ in range(block - 1)] for s in range(prompt_len, total - 1)}
    accept = np.array(
        [[float(j < total - s - 1 and d == token_ids[s + 1 + j]) for j, d in enumerate(drafts[s])] for s in drafts]
    ).reshape(len(drafts), block - 1)
    taus = chain_round_taus(token_ids, prompt_len, block, _Drafts(drafts))
    got = expected_rounds(accept)
    if not taus:
        assert got == expected_rounds(np.zeros((0, block - 1)))
        assert got.mean_tau is None
        return
    assert got.rounds == pytest.approx(len(taus), abs=1e-12)
    assert got.accepted == pytest.approx(sum(taus) - len(taus), abs=1e-12)
    assert got.mean_tau == pytest.approx(sum(taus) / len(taus), abs=1e-12)


def test_no_round_when_the_response_is_one_token() -> None:
    got = expected_rounds(np.zeros((0, 4)))
    assert (got.rounds, got.accepted, got.mean_tau) == (0.0, 0.0, None)
