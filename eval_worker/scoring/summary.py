"""Aggregate per-round taus into per-prompt and per-run numbers (pure functions)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from schemas.report import PromptEval, RoundTaus, SetSummary, TauSummary


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


def summarize_set(results: Sequence[PromptEval], budgets: Sequence[int], eagle_keys: Sequence[str]) -> SetSummary:
    """Chain, every DDTree budget and every EAGLE tree over `results`."""
    return SetSummary(
        chain=summarize([r.chain for r in results]),
        trees={b: summarize([r.trees[b] for r in results]) for b in budgets},
        eagle_trees={k: summarize([r.eagle_trees[k] for r in results]) for k in eagle_keys},
        prompts_evaluated=len(results),
    )


def by_set(
    results: Sequence[PromptEval],
    members: Mapping[str, Sequence[str]],
    budgets: Sequence[int],
    eagle_keys: Sequence[str],
) -> dict[str, SetSummary]:
    """Each set's summary over its prompts that were evaluated (a prompt in two sets counts in both)."""
    out = {}
    for name, ids in members.items():
        wanted = set(ids)
        out[name] = summarize_set([r for r in results if r.prompt_id in wanted], budgets, eagle_keys)
    return out
