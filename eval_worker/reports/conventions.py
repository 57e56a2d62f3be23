"""The two ways engines average tau, as every table labels them: `per-prompt` (DFlash's benchmark and
SGLang: each prompt's mean round tau, then the mean over prompts) and `pooled` (vLLM: every round of every
prompt together, total tokens / total rounds = 1 + accepted / drafts)."""

from __future__ import annotations

PER_PROMPT = "per-prompt"
POOLED = "pooled"
TAU_LEGEND = (
    f"{PER_PROMPT}: mean of each prompt's mean round tau (DFlash, SGLang); "
    f"{POOLED}: tokens/rounds = 1 + accepted/drafts (vLLM)"
)


def fmt(x: float | None) -> str:
    """A tau, or `-` where there is none."""
    return "-" if x is None else f"{x:.3f}"
