"""`eval-worker compare`: a table of reports by step, and a plot of tau vs step and of the
per-position acceptance curve (the fraction of rounds that accept at least k tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schemas.report import EvalReport, TauSummary


def _sort_key(r: EvalReport) -> tuple[int, str]:
    return (r.step if r.step is not None else -1, r.checkpoint_path)


def _tau(s: TauSummary | None) -> str:
    return "-" if s is None or s.mean_tau is None else f"{s.mean_tau:.3f}"


def compare_table(reports: Sequence[EvalReport]) -> str:
    budgets = sorted({b for r in reports for b in r.summary.trees})
    head = f"{'step':>8}  {'checkpoint':<32} {'layers':<22} {'prompts':>7} {'chain':>7}"
    head += "".join(f" {'ddtree-' + str(b):>10}" for b in budgets)
    lines = [head]
    for r in sorted(reports, key=_sort_key):
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


def plot(reports: Sequence[EvalReport], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(reports, key=_sort_key)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    steps = [r.step if r.step is not None else i for i, r in enumerate(ordered)]
    left.plot(steps, [r.summary.chain.mean_tau for r in ordered], "o-", label="chain")
    for b in sorted({b for r in ordered for b in r.summary.trees}):
        pts = [(s, r.summary.trees[b].mean_tau) for s, r in zip(steps, ordered, strict=True) if b in r.summary.trees]
        left.plot([p[0] for p in pts], [p[1] for p in pts], "s--", label=f"DDTree-{b}")
    left.set(xlabel="training step", ylabel="tau (mean acceptance length)", title="tau vs step")
    left.grid(alpha=0.3)
    left.legend()
    for s, r in zip(steps, ordered, strict=True):
        curve = acceptance_curve(r.summary.chain, r.block_size)
        right.plot(range(1, len(curve) + 1), curve, "o-", label=f"step {s}")
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
