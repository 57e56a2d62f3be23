"""The `compare --plot` figure (matplotlib, from the `[plot]` extra, imported only here): chain tau vs
training step, one panel per sampling setting (T = 0 first) and one line per run, each point with its
standard error; the trees at T = 0; each run's acceptance by position; the runs' legend in a cell of its own."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval_worker.reports.compare import acceptance_curve, by_run, max_round_tau
from eval_worker.reports.run_label import run_label
from eval_worker.reports.sampling_settings import by_setting, settings
from schemas.report import EvalReport, SetSummary, TauSummary
from schemas.sampling import GREEDY_SETTING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_COLUMNS = 3
_FEW_STEPS = 8  # up to this many distinct steps, each gets its tick
_TREE_STYLES = ("--", ":", "-.")
_TREE_MARKERS = ("s", "^", "D", "v", "P")


def _runs(reports: Sequence[EvalReport]) -> dict[str, list[EvalReport]]:
    """The reports of each run (its label), by step."""
    out: dict[str, list[EvalReport]] = {}
    for r in sorted(reports, key=by_run):
        out.setdefault(run_label(r), []).append(r)
    return out


def _step(r: EvalReport) -> int:
    return r.step if r.step is not None else 0


def _line(ax: Any, reports: Sequence[EvalReport], picked: Sequence[TauSummary | None], **style: Any) -> None:
    """tau vs step with its standard error (a bar of zero with fewer than two prompts)."""
    points = [
        (_step(r), s.mean_tau, s.stderr or 0.0)
        for r, s in zip(reports, picked, strict=True)
        if s is not None and s.mean_tau is not None
    ]
    if points:
        xs, ys, errs = zip(*points, strict=True)
        ax.errorbar(xs, ys, yerr=errs, capsize=3, markersize=4, linewidth=1.4, **style)


def _at(reports: Sequence[EvalReport], setting: str) -> list[SetSummary | None]:
    return [by_setting(r.summary).get(setting) for r in reports]


def _tree_kinds(reports: Sequence[EvalReport]) -> list[int | str]:
    """Every DDTree budget (int) and EAGLE tree (`TOPK,DEPTH,TOTAL`) any report walked."""
    budgets: list[int | str] = sorted({b for r in reports for b in r.summary.trees})
    return budgets + sorted({k for r in reports for k in r.summary.eagle_trees})


def _tree(s: SetSummary | None, kind: int | str) -> TauSummary | None:
    if s is None:
        return None
    return s.trees.get(kind) if isinstance(kind, int) else s.eagle_trees.get(kind)


def _ticks(ax: Any, steps: Sequence[int] = ()) -> None:
    """Whole numbers on the x axis (at the steps themselves when there are few), several on the y axis."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    few = sorted(set(steps))
    ax.xaxis.set_major_locator(FixedLocator(few) if 0 < len(few) <= _FEW_STEPS else MaxNLocator(integer=True, nbins=6))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=7))
    ax.grid(alpha=0.3)


def plot(reports: Sequence[EvalReport], out: Path) -> None:
    """Write the PNG of `figure(reports)`."""
    import matplotlib.pyplot as plt

    fig = figure(reports)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def figure(reports: Sequence[EvalReport]) -> Figure:
    """A panel per setting, the trees' panel (when walked), the acceptance panel, the legends' cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _runs(reports)
    found = settings(reports)
    trees = _tree_kinds(reports)
    panels = len(found) + bool(trees) + 1
    cols = min(_COLUMNS, panels + 1)
    rows = math.ceil((panels + 1) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    cmap = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    colors = {label: cmap(i % cmap.N) for i, label in enumerate(runs)}
    tau_axes = axes[: len(found) + bool(trees)]
    for ax, setting in zip(axes, found, strict=False):
        for label, mine in runs.items():
            _line(ax, mine, [x.chain if x else None for x in _at(mine, setting)], fmt="o-", color=colors[label])
        ax.set(
            title=f"chain tau, responses at {setting}", xlabel="training step", ylabel="tau (per-prompt mean ± s.e.)"
        )
    if trees:
        _trees(axes[len(found)], runs, trees, colors)
    _acceptance(axes[panels - 1], runs, colors)
    for ax in tau_axes[1:]:
        ax.sharey(tau_axes[0])
    steps = [_step(r) for r in reports]
    for ax in tau_axes:
        _ticks(ax, steps)
    _ticks(axes[panels - 1])
    _legend(axes[panels], runs, colors, trees)
    for ax in axes[panels + 1 :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def _trees(
    ax: Any,
    runs: dict[str, list[EvalReport]],
    trees: Sequence[int | str],
    colors: dict[str, Any],
) -> None:
    """Every tree's tau at T = 0 (trees are walked on greedy responses only), styled by tree, colored by run."""
    for i, kind in enumerate(trees):
        style = _tree_style(i)
        for label, mine in runs.items():
            _line(ax, mine, [_tree(s, kind) for s in _at(mine, GREEDY_SETTING)], color=colors[label], **style)
    ax.set(
        title=f"tree tau, responses at {GREEDY_SETTING}", xlabel="training step", ylabel="tau (per-prompt mean ± s.e.)"
    )


def _acceptance(ax: Any, runs: dict[str, list[EvalReport]], colors: dict[str, Any]) -> None:
    """Each run's last step: the fraction of T = 0 chain rounds that count at least k tokens, from k = 2
    (every round counts the bonus token: k = 1 is always 1)."""
    longest = 2
    for label, mine in runs.items():
        last = mine[-1]
        chain = by_setting(last.summary).get(GREEDY_SETTING)
        if chain is None:
            continue
        curve = acceptance_curve(chain.chain, max_round_tau(last))
        longest = max(longest, len(curve) + 1)
        ax.plot(range(2, len(curve) + 2), curve, "o-", markersize=3, color=colors[label])
    ax.set(
        title=f"chain acceptance by position, {GREEDY_SETTING}, each run's last step",
        xlabel="k (tokens a round counts, bonus included)",
        ylabel="fraction of rounds with tau >= k",
        ylim=(0, 1.02),
        xlim=(1.7, longest + 0.3),
    )


def _tree_style(i: int) -> dict[str, Any]:
    return {"linestyle": _TREE_STYLES[i % len(_TREE_STYLES)], "marker": _TREE_MARKERS[i % len(_TREE_MARKERS)]}


def _legend(ax: Any, runs: dict[str, list[EvalReport]], colors: dict[str, Any], trees: Sequence[int | str]) -> None:
    """The cell beside the panels, off the data: each run's color (its label, its steps), each tree's style."""
    from matplotlib.lines import Line2D

    ax.axis("off")
    handles = [
        Line2D(
            [], [], marker="o", color=colors[label], label=f"{label} (steps {', '.join(str(_step(r)) for r in mine)})"
        )
        for label, mine in runs.items()
    ]
    shown = ax.legend(
        handles=handles, loc="upper left", fontsize="small", frameon=False, title="runs", alignment="left"
    )
    if trees:
        ax.add_artist(shown)
        styles = [
            Line2D(
                [], [], color="0.35", label=f"DDTree-{k}" if isinstance(k, int) else f"EAGLE tree {k}", **_tree_style(i)
            )
            for i, k in enumerate(trees)
        ]
        ax.legend(handles=styles, loc="lower left", fontsize="small", frameon=False, title="trees", alignment="left")
