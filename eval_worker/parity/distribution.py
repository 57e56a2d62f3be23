"""Parity under probabilistic drafting, where the live count is random given the output path.

Given the paths, the engine's accept/reject draws are independent (REFERENCE s.15), and the offline side
knows the exact expectation of each path's rounds and accepted drafts (`PromptEval.probabilistic`). The
test compares the live mean accepted drafts per round over all rounds of all samples, m = A / R, with
mu = sum E[accepted] / sum E[rounds] over the same paths:

- Under a lossless engine serving this checkpoint, m - mu is approximately normal with standard deviation
  sigma / sqrt(R), sigma^2 the variance of accepted drafts per round (the renewal CLT: the rounds of a path
  partition its fixed length). sigma^2 is estimated from the live rounds themselves: each sample's
  per-position counter deltas give its rounds' distribution (rounds that accepted >= j drafts = the delta
  at position j - 1). Pooling rounds of different acceptance rates only adds to that variance, so the
  test errs on the side of agreeing.
- It agrees when |m - mu| <= z_{0.995} sigma / sqrt(R): a lossless engine fails it with probability ~1%.
- Power: a true shift d of the live mean is caught with probability >= 95% when |d| >= (z_{0.995} +
  z_{0.95}) sigma / sqrt(R) = 4.22 sigma / sqrt(R) (`detectable` in the report); e.g. sigma = 1, R = 400:
  0.21 accepted drafts per round. More samples (`--samples`) shrink it as 1 / sqrt(R).

The engine counts drafts accepted past `max_tokens` in a sample's last round (it counts before its stop
check), where the offline expectation counts only the tokens the output kept: each sample's live accepted
count is capped at the tokens it kept (response tokens - rounds) before the mean; the variance is read
from the counters as counted (at most one round per sample differs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from eval_worker.parity.engine import SpecCounters
from schemas.parity import DistributionCheck
from schemas.report import ExpectedRounds

CONFIDENCE = 0.99
POWER = 0.95


def accepted_histogram(live: SpecCounters) -> list[int]:
    """Rounds that accepted exactly m drafts, m = 0..K, from the per-position deltas of one request."""
    at_least = [live.drafts, *live.per_position, 0]
    return [at_least[m] - at_least[m + 1] for m in range(len(at_least) - 1)]


def kept_accepted(live: SpecCounters, response_tokens: int) -> int:
    """Accepted drafts the output kept: at most response tokens - rounds (each round adds one of its own)."""
    return max(0, min(live.accepted, response_tokens - live.drafts))


def round_variance(histograms: Sequence[Sequence[int]]) -> float:
    """The sample variance of accepted drafts per round over the pooled rounds (0 with fewer than two)."""
    counts = [0] * max((len(h) for h in histograms), default=0)
    for h in histograms:
        for m, c in enumerate(h):
            counts[m] += c
    rounds = sum(counts)
    if rounds < 2:
        return 0.0
    mean = sum(m * c for m, c in enumerate(counts)) / rounds
    return sum(c * (m - mean) ** 2 for m, c in enumerate(counts)) / (rounds - 1)


def distribution_check(
    live: Sequence[SpecCounters],
    response_tokens: Sequence[int],
    expected: Sequence[ExpectedRounds],
    confidence: float = CONFIDENCE,
    power: float = POWER,
) -> DistributionCheck:
    """The test over every sample: its live counters, its output's length, its offline expectation."""
    rounds = sum(c.drafts for c in live)
    accepted = sum(kept_accepted(c, n) for c, n in zip(live, response_tokens, strict=True))
    e_rounds, e_accepted = sum(e.rounds for e in expected), sum(e.accepted for e in expected)
    live_mean = accepted / rounds if rounds else 0.0
    expected_mean = e_accepted / e_rounds if e_rounds else 0.0
    stderr = math.sqrt(round_variance([accepted_histogram(c) for c in live]) / rounds) if rounds else 0.0
    z_two = NormalDist().inv_cdf(0.5 + confidence / 2)
    half = z_two * stderr
    z = (live_mean - expected_mean) / stderr if stderr > 0 else None
    agrees = abs(live_mean - expected_mean) <= half if stderr > 0 else math.isclose(live_mean, expected_mean)
    return DistributionCheck(
        live_rounds=rounds,
        live_accepted=accepted,
        live_mean=live_mean,
        expected_rounds=e_rounds,
        expected_accepted=e_accepted,
        expected_mean=expected_mean,
        stderr=stderr,
        z=z,
        confidence=confidence,
        interval=(expected_mean - half, expected_mean + half),
        detectable=(z_two + NormalDist().inv_cdf(power)) * stderr,
        power=power,
        agrees=agrees,
    )
