"""The `compare --plot` figure (matplotlib, from the `[plot]` extra, imported only here)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval_worker.reports.compare import acceptance_curve, by_step, max_round_tau, sampled_settings
from schemas.report import EvalReport, TauSummary


def _chain_at(report: EvalReport, setting: str) -> TauSummary | None:
    found = report.summary.by_sampling.get(setting)
    return found.chain if found is not None else None


def plot(reports: Sequence[EvalReport], out: Path) -> None:
    """Write a PNG: tau vs training step (chain, per sampling setting of the responses when any was
    sampled, and every tree), and each report's acceptance curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(reports, key=by_step)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    steps = [r.step if r.step is not None else i for i, r in enumerate(ordered)]
    settings = [s for s, kind in sampled_settings(ordered) if kind == "chain"]
    for family in sorted({r.drafter_family for r in ordered}):
        mine = [(s, r) for s, r in zip(steps, ordered, strict=True) if r.drafter_family == family]
        if not settings:
            left.plot([s for s, _ in mine], [r.summary.chain.mean_tau for _, r in mine], "o-", label=f"{family} chain")
        for setting in settings:  # tau vs step per temperature, each with its standard error
            points = [(s, c.mean_tau, c.stderr or 0.0) for s, r in mine if (c := _chain_at(r, setting)) and c.mean_tau]
            if points:
                xs, ys, errs = zip(*points, strict=True)
                left.errorbar(xs, ys, yerr=errs, fmt="o-", capsize=3, label=f"{family} chain {setting}")
        trees = {f"DDTree-{b}": (lambda r, b=b: r.summary.trees.get(b)) for r in ordered for b in r.summary.trees}
        trees |= {
            f"EAGLE-{k}": (lambda r, k=k: r.summary.eagle_trees.get(k)) for r in ordered for k in r.summary.eagle_trees
        }
        for label, pick in sorted(trees.items()):
            pts = [(s, t.mean_tau) for s, r in mine if (t := pick(r)) is not None]
            if pts:
                at = " T=0" if settings else ""  # trees are walked on greedy responses only
                left.plot([p[0] for p in pts], [p[1] for p in pts], "s--", label=f"{family} {label}{at}")
    left.set(xlabel="training step", ylabel="tau (mean acceptance length)", title="tau vs step")
    left.grid(alpha=0.3)
    left.legend()
    for s, r in zip(steps, ordered, strict=True):
        curve = acceptance_curve(r.summary.chain, max_round_tau(r))
        right.plot(range(1, len(curve) + 1), curve, "o-", label=f"{r.drafter_family} step {s}")
    right.set(
        xlabel="k (tokens accepted in a round, bonus included)",
        ylabel="fraction of rounds with tau >= k",
        title="chain acceptance by position",
        ylim=(0, 1.05),
    )
    right.grid(alpha=0.3)
    right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
