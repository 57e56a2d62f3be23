"""`eval-worker compare`: reports side by side by step, and the per-position acceptance curve (the
fraction of rounds that accept at least k tokens) that `plot.py` draws."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schemas.report import EvalReport, TauSummary


def by_step(r: EvalReport) -> tuple[int, str]:
    """Sort key: training step, then path."""
    return (r.step if r.step is not None else -1, r.checkpoint_path)


def _tau(s: TauSummary | None) -> str:
    return "-" if s is None or s.mean_tau is None else f"{s.mean_tau:.3f}"


def compare_table(reports: Sequence[EvalReport]) -> str:
    """One row per report (by step): layers, prompts, chain tau and each DDTree tau."""
    budgets = sorted({b for r in reports for b in r.summary.trees})
    head = f"{'step':>8}  {'checkpoint':<32} {'layers':<22} {'prompts':>7} {'chain':>7}"
    head += "".join(f" {'ddtree-' + str(b):>10}" for b in budgets)
    lines = [head]
    for r in sorted(reports, key=by_step):
        step = "-" if r.step is None else str(r.step)
        name = Path(r.checkpoint_path).name[-32:]
        row = f"{step:>8}  {name:<32} {r.target_layer_ids!s:<22} {r.summary.prompts_evaluated:>7} "
        row += f"{_tau(r.summary.chain):>7}" + "".join(f" {_tau(r.summary.trees.get(b)):>10}" for b in budgets)
        lines.append(row)
    targets = {r.target_fingerprint for r in reports}
    if len(targets) > 1:
        lines.append(f"warning: these reports come from {len(targets)} different targets: {sorted(targets)}")
    return "\n".join(lines)


def acceptance_curve(summary: TauSummary, block_size: int) -> list[float]:
    """P(round tau >= k) for k = 1..block_size, from the round histogram."""
    rounds = summary.total_rounds
    if not rounds:
        return [0.0] * block_size
    return [sum(n for tau, n in summary.histogram.items() if tau >= k) / rounds for k in range(1, block_size + 1)]
