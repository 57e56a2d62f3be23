"""`eval-worker compare`: reports side by side by step, and the per-position acceptance curve (the
fraction of rounds that accept at least k tokens) that `plot.py` draws."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schemas.report import EvalReport, ExpectedSummary, TauSummary
from schemas.sampling import GREEDY_SETTING, setting_temperature


def by_step(r: EvalReport) -> tuple[int, str]:
    """Sort key: training step, then path."""
    return (r.step if r.step is not None else -1, r.checkpoint_path)


def _tau(s: TauSummary | ExpectedSummary | None) -> str:
    return "-" if s is None or s.mean_tau is None else f"{s.mean_tau:.3f}"


def _se(s: TauSummary | ExpectedSummary | None) -> str:
    return "-" if s is None or s.stderr is None else f"{s.stderr:.3f}"


def sampled_settings(reports: Sequence[EvalReport]) -> list[tuple[str, str]]:
    """(setting, column) pairs when any report has responses sampled at T > 0: chain tau and its
    standard error per setting, and probabilistic drafting's where it was measured."""
    found = sorted({s for r in reports for s in r.summary.by_sampling}, key=lambda s: (setting_temperature(s), s))
    if set(found) <= {GREEDY_SETTING}:
        return []
    out = []
    for setting in found:
        out += [(setting, "chain"), (setting, "s.e.")]
        measured = any((r.summary.by_sampling.get(setting) or r.summary).probabilistic for r in reports)
        if measured and setting != GREEDY_SETTING:  # at T = 0 probabilistic drafting is the chain walk itself
            out += [(setting, "probabilistic"), (setting, "prob s.e.")]
    return out


def _setting_column(setting: str, kind: str) -> str:
    return f"{setting.replace(' ', ',')}:{kind.replace(' ', '-')}"


def _setting_tau(r: EvalReport, setting: str, kind: str) -> str:
    s = r.summary.by_sampling.get(setting)
    if s is None:
        return "-"
    picked = {"chain": (_tau, s.chain), "s.e.": (_se, s.chain), "probabilistic": (_tau, s.probabilistic)}
    show, summary = picked.get(kind, (_se, s.probabilistic))
    return show(summary)


def compare_table(reports: Sequence[EvalReport]) -> str:
    """One row per report (by step): family, layers, prompts, chain tau, each DDTree and EAGLE tree tau.

    A family's tree columns are blank for the other family: DDTree needs a DFlash block, EAGLE trees an
    EAGLE-3 step."""
    budgets = sorted({b for r in reports for b in r.summary.trees})
    shapes = sorted({k for r in reports for k in r.summary.eagle_trees}, key=lambda k: [int(x) for x in k.split(",")])
    settings = sampled_settings(reports)
    head = f"{'step':>8}  {'checkpoint':<32} {'family':<7} {'layers':<22} {'prompts':>7} {'chain':>7} {'s.e.':>6}"
    head += "".join(f" {'ddtree-' + str(b):>10}" for b in budgets)
    head += "".join(f" {'eagle-' + k:>14}" for k in shapes)
    head += "".join(f" {_setting_column(s, kind):>{len(_setting_column(s, kind))}}" for s, kind in settings)
    sets = sorted({name for r in reports for name in r.summary.by_set})
    columns = [(name, kind) for name in sets for kind in ["chain", *map(str, budgets), *shapes]]
    head += "".join(f" {_set_column(name, kind):>{_width(name, kind)}}" for name, kind in columns)
    lines = [head]
    for r in sorted(reports, key=by_step):
        step = "-" if r.step is None else str(r.step)
        name = Path(r.checkpoint_path).name[-32:]
        row = f"{step:>8}  {name:<32} {r.drafter_family:<7} {r.target_layer_ids!s:<22} "
        row += f"{r.summary.prompts_evaluated:>7} {_tau(r.summary.chain):>7} {_se(r.summary.chain):>6}"
        row += "".join(f" {_tau(r.summary.trees.get(b)):>10}" for b in budgets)
        row += "".join(f" {_tau(r.summary.eagle_trees.get(k)):>14}" for k in shapes)
        row += "".join(f" {_setting_tau(r, s, kind):>{len(_setting_column(s, kind))}}" for s, kind in settings)
        row += "".join(f" {_tau(_set_tau(r, name, kind)):>{_width(name, kind)}}" for name, kind in columns)
        lines.append(row)
    if settings and (budgets or shapes):
        lines.append("trees: walked on greedy (T = 0) responses only")
    targets = {r.target_fingerprint for r in reports}
    if len(targets) > 1:
        lines.append(f"warning: these reports come from {len(targets)} different targets: {sorted(targets)}")
    storages = {r.feature_storage for r in reports}
    if len(storages) > 1:
        lines.append(
            f"warning: these reports read features stored as {sorted(storages)}: a lossy store's tau is not exact"
        )
    return "\n".join(lines)


def max_round_tau(report: EvalReport) -> int:
    """The most a chain round can score: a DFlash block's length, or the steps + 1 of a chain drafter."""
    return report.drafting.longest_round


def _set_column(name: str, kind: str) -> str:
    """`gsm8k:chain`, `gsm8k:ddtree-8`, `gsm8k:eagle-10,7,60`: one column group per set."""
    return f"{name}:{kind if kind == 'chain' else ('eagle-' if ',' in kind else 'ddtree-') + kind}"


def _width(name: str, kind: str) -> int:
    return max(8, len(_set_column(name, kind)))


def _set_tau(r: EvalReport, name: str, kind: str) -> TauSummary | None:
    s = r.summary.by_set.get(name)
    if s is None:
        return None
    if kind == "chain":
        return s.chain
    return s.eagle_trees.get(kind) if "," in kind else s.trees.get(int(kind))


def acceptance_curve(summary: TauSummary, longest: int) -> list[float]:
    """P(round tau >= k) for k = 1..longest, from the round histogram."""
    rounds = summary.total_rounds
    if not rounds:
        return [0.0] * longest
    return [sum(n for tau, n in summary.histogram.items() if tau >= k) / rounds for k in range(1, longest + 1)]
