"""Expected rounds of probabilistic drafting along one output path, exactly (a dynamic program).

Given the path y, draft j = 1..K of a round anchored at s is accepted with probability
a_j = min(1, q(y[s+j]) / p_T(y[s+j])), independently across positions (REFERENCE section 15). A
round accepts m drafts with probability a_1 ... a_m (1 - a_{m+1}), where a_{K'+1} = 0 and K' is the
number of reference tokens that remain (as the greedy walk of `acceptance.py` compares only those);
the next round starts at s + m + 1 and the walk stops once s >= T - 1. The program carries the
probability of standing at each position after each number of rounds, so it gives E[rounds],
E[accepted] and E[(sum of round taus) / rounds] (the mean round tau) without sampling.

Arrays of accept probabilities are [A, K]: row u is anchor s = prompt_len + u (A = T - 1 - prompt_len
anchors), column j - 1 is draft j (the reference token y[s + j]).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from schemas.report import ExpectedRounds

Floats = NDArray[np.float64]


def remaining(num_anchors: int, depth: int) -> NDArray[np.int64]:
    """K' per anchor [A]: drafts a round at row u can have accepted (min(depth, A - u) tokens remain)."""
    return np.minimum(depth, num_anchors - np.arange(num_anchors, dtype=np.int64))


def accepted_length_probs(accept: Floats, left: NDArray[np.int64]) -> Floats:
    """accept [A, K] and K' [A] -> P(m drafts accepted) [A, K+1]; columns past K' + 1 are zero."""
    a, k = accept.shape
    usable = np.arange(k)[None, :] < left[:, None]  # [A, K]: positions with a reference token
    rate = np.where(usable, np.clip(accept, 0.0, 1.0), 0.0)
    rate = np.concatenate([rate, np.zeros((a, 1))], axis=1)  # [A, K+1]: the bonus position never "accepts"
    survive = np.cumprod(np.concatenate([np.ones((a, 1)), rate[:, :-1]], axis=1), axis=1)  # [A, K+1]: a_1..a_m
    return survive * (1.0 - rate)


def ending_rounds(lengths: Floats) -> Floats:
    """P(m | u) [A, K+1] -> P(the walk ends at u after r rounds) [2, A + 1]: rows u = A and A + 1 (s = T - 1
    and s = T, the walk's two possible ends), columns r = 0..A (each round advances at least one position).

    P(standing at u after r rounds) is carried forward over u; a round from u lands at most K + 1 ahead,
    so K + 2 rows are held at once (row u lives in slot u mod K + 2): O(A^2 K) time, O(A K) memory."""
    a, k1 = lengths.shape
    slots = k1 + 1
    dist = np.zeros((slots, a + 1))  # [K + 2, A + 1]
    dist[0, 0] = 1.0
    for u in range(a):
        here = dist[u % slots]
        reach = min(k1, a + 1 - u)  # m = 0..reach-1 lands on u + 1 .. u + reach (<= A + 1)
        lo = -(-u // k1)  # u positions take between ceil(u / (K+1)) and u rounds: only that band is nonzero
        landing = [(u + 1 + m) % slots for m in range(reach)]
        dist[landing, lo + 1 : u + 2] += lengths[u, :reach, None] * here[None, lo : u + 1]
        here[:] = 0.0  # row u is spent: row u + K + 2 takes its slot
    return dist[[a % slots, (a + 1) % slots]]


def expected_rounds(accept: ArrayLike) -> ExpectedRounds:
    """accept [A, K] (a[s, j] for anchors s = prompt_len .. T-2) -> expected rounds, accepted drafts and
    mean round tau of the walk over the path (None when the response leaves no round)."""
    rates = np.asarray(accept, dtype=np.float64)
    a = rates.shape[0]
    if a == 0:
        return ExpectedRounds(rounds=0.0, accepted=0.0, mean_tau=None)
    ends = ending_rounds(accepted_length_probs(rates, remaining(a, rates.shape[1])))  # [2, A + 1]
    tokens = np.array([a, a + 1], dtype=np.float64)[:, None]  # sum of round taus = where it ended
    rounds = np.arange(a + 1, dtype=np.float64)[None, :]
    expected_tokens = float((ends * tokens).sum())
    expected = float((ends * rounds).sum())
    mean_tau = float((ends[:, 1:] * tokens / rounds[:, 1:]).sum())
    return ExpectedRounds(rounds=expected, accepted=expected_tokens - expected, mean_tau=mean_tau)
