"""Aggregate per-round taus into per-prompt and per-run numbers (pure functions)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from schemas.report import RoundTaus, TauSummary


def round_taus(taus: Sequence[int]) -> RoundTaus:
    """A prompt's round taus and their mean (None without rounds)."""
    return RoundTaus(round_taus=list(taus), mean=sum(taus) / len(taus) if taus else None)


def summarize(per_prompt: Sequence[RoundTaus]) -> TauSummary:
    """Mean of per-prompt means (DFlash convention), total tokens / total rounds, round histogram."""
    means = [p.mean for p in per_prompt if p.mean is not None]
    total_tokens = sum(sum(p.round_taus) for p in per_prompt)
    total_rounds = sum(len(p.round_taus) for p in per_prompt)
    histogram = Counter(t for p in per_prompt for t in p.round_taus)
    return TauSummary(
        mean_tau=sum(means) / len(means) if means else None,
        tokens_per_round=total_tokens / total_rounds if total_rounds else None,
        total_tokens=total_tokens,
        total_rounds=total_rounds,
        histogram=dict(sorted(histogram.items())),
        prompts_evaluated=len(per_prompt),
        prompts_without_rounds=len(per_prompt) - len(means),
    )
