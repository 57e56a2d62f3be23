"""`compare --plot`: one line per run with its standard errors, each setting apart, legends off the data,
integer steps and k, the acceptance curve from k = 2; readable with a leaderboard's worth of reports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from eval_worker.reports.plot import figure, plot
from eval_worker.reports.run_label import run_label
from testing.leaderboard_reports import leaderboard_reports

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.container import ErrorbarContainer

    Panels = list[tuple[Axes, list[ErrorbarContainer]]]

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def axes() -> Iterator[Panels]:
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    fig = figure(leaderboard_reports())
    fig.canvas.draw()
    yield [(ax, [c for c in ax.containers if isinstance(c, ErrorbarContainer)]) for ax in fig.axes]
    plt.close(fig)


def test_each_setting_has_a_panel_with_a_line_per_run_and_its_error_bars(axes: Panels) -> None:
    runs = {run_label(r) for r in leaderboard_reports()}
    titles = [ax.get_title() for ax, _ in axes]
    assert titles[:3] == [
        "chain tau, responses at T=0",
        "chain tau, responses at T=0.6 top_p=0.95",
        "chain tau, responses at T=1",
    ]
    for ax, bars in axes[:3]:
        assert len(bars) == len(runs) == 6  # one line per run, not per family (there are three)
        assert all(b.has_yerr for b in bars)
        assert len(ax.get_yticks()) >= 5
        assert all(float(t).is_integer() for t in ax.get_xticks())
        assert ax.get_legend() is None  # the legends have a cell of their own


def test_the_acceptance_curve_starts_at_two_tokens(axes: Panels) -> None:
    ax = next(ax for ax, _ in axes if ax.get_title().startswith("chain acceptance"))
    assert min(np.asarray(line.get_xdata())[0] for line in ax.get_lines()) == 2
    assert all(float(t).is_integer() for t in ax.get_xticks())
    cell = next(ax for ax, _ in axes if ax.get_legend() is not None)
    legend = cell.get_legend()
    assert legend is not None and not cell.axison
    assert len(legend.get_texts()) == 3  # the trees' (the runs' legend is the one added before it)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "tau.png"
    plot(leaderboard_reports()[:2], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
