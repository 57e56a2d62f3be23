"""The two ways engines average tau, as every table labels them: `per-prompt` (DFlash's benchmark and
SGLang: each prompt's mean round tau, then the mean over prompts) and `pooled` (vLLM: every round of every
prompt together, total tokens / total rounds = 1 + accepted / drafts)."""

from __future__ import annotations

from eval_worker.reports.sampling_settings import by_setting
from schemas.report import SetSummary

PER_PROMPT = "per-prompt"
POOLED = "pooled"
TAU_LEGEND = (
    f"{PER_PROMPT}: mean of each prompt's mean round tau (DFlash, SGLang); "
    f"{POOLED}: tokens/rounds = 1 + accepted/drafts (vLLM)"
)


def fmt(x: float | None) -> str:
    """A tau, or `-` where there is none."""
    return "-" if x is None else f"{x:.3f}"


def chain_line(summary: SetSummary) -> str:
    """A log line's chain tau: per sampling setting (T = 0 first), both conventions labelled, never one
    number averaging greedy and sampled responses."""
    return "; ".join(
        f"{setting}: {PER_PROMPT} {fmt(s.chain.mean_tau)}, {POOLED} {fmt(s.chain.tokens_per_round)}"
        for setting, s in by_setting(summary).items()
    )
