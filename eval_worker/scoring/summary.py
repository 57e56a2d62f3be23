"""Aggregate per-round taus into per-prompt and per-run numbers (pure functions), with the standard
error of every mean over prompts, and per sampling setting of the responses."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from schemas.report import ExpectedSummary, PromptEval, RoundTaus, SetSummary, TauSummary
from schemas.sampling import GREEDY_SETTING


def round_taus(taus: Sequence[int]) -> RoundTaus:
    """A prompt's round taus and their mean (None without rounds)."""
    return RoundTaus(round_taus=list(taus), mean=sum(taus) / len(taus) if taus else None)


def clustered_stderr(values: Sequence[float], clusters: Sequence[str] | None = None) -> float | None:
    """Standard error of the mean of `values` over independent units: the values of one cluster (the
    samples of one prompt, which share it and are not independent) are averaged first; None with fewer
    than two units."""
    groups: dict[str, list[float]] = {}
    for i, v in enumerate(values):
        groups.setdefault(clusters[i] if clusters is not None else str(i), []).append(v)
    units = [sum(g) / len(g) for g in groups.values()]
    if len(units) < 2:
        return None
    mean = sum(units) / len(units)
    return math.sqrt(sum((u - mean) ** 2 for u in units) / (len(units) - 1) / len(units))


def summarize(per_prompt: Sequence[RoundTaus], clusters: Sequence[str] | None = None) -> TauSummary:
    """Mean of per-prompt means (DFlash convention) with its standard error (`clusters[i]`: prompt i's
    source prompt), total tokens / total rounds, round histogram."""
    scored = [(i, p.mean) for i, p in enumerate(per_prompt) if p.mean is not None]
    means = [m for _, m in scored]
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
        stderr=clustered_stderr(means, [clusters[i] for i, _ in scored] if clusters is not None else None),
    )


def setting_of(result: PromptEval) -> str:
    """The sampling setting of a prompt's response (`T=0` when greedy or not recorded)."""
    return result.sampling.setting if result.sampling is not None else GREEDY_SETTING


def _expected(results: Sequence[PromptEval]) -> ExpectedSummary | None:
    """Probabilistic drafting's numbers over the prompts that have them (None: not measured)."""
    measured = [(r, r.probabilistic) for r in results if r.probabilistic is not None]
    if not measured:
        return None
    scored = [(r, e.mean_tau) for r, e in measured if e.mean_tau is not None]
    rounds = sum(e.rounds for _, e in measured)
    tokens = sum(e.rounds + e.accepted for _, e in measured)  # every round's bonus, plus its accepted drafts
    return ExpectedSummary(
        mean_tau=sum(m for _, m in scored) / len(scored) if scored else None,
        tokens_per_round=tokens / rounds if rounds else None,
        stderr=clustered_stderr([m for _, m in scored], [r.prompt_sha256 or r.prompt_id for r, _ in scored]),
        prompts_evaluated=len(measured),
    )


def summarize_set(
    results: Sequence[PromptEval], budgets: Sequence[int], eagle_keys: Sequence[str], *, per_setting: bool = True
) -> SetSummary:
    """Chain, every DDTree budget and every EAGLE tree (over the prompts whose trees were walked: the
    greedy ones), probabilistic drafting when measured, over `results`; and the same per sampling setting."""
    clusters = [r.prompt_sha256 or r.prompt_id for r in results]
    treed = [r for r in results if r.trees or r.eagle_trees]
    tree_clusters = [r.prompt_sha256 or r.prompt_id for r in treed]
    settings = sorted({setting_of(r) for r in results}) if per_setting else []
    return SetSummary(
        chain=summarize([r.chain for r in results], clusters),
        trees={b: summarize([r.trees[b] for r in treed if b in r.trees], tree_clusters) for b in budgets if treed},
        eagle_trees={
            k: summarize([r.eagle_trees[k] for r in treed if k in r.eagle_trees], tree_clusters)
            for k in eagle_keys
            if treed
        },
        probabilistic=_expected(results),
        prompts_evaluated=len(results),
        by_sampling={
            s: summarize_set([r for r in results if setting_of(r) == s], budgets, eagle_keys, per_setting=False)
            for s in settings
        },
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
