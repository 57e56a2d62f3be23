"""`eval-worker compare`: reports side by side, a row per run and step, each tau both ways (per-prompt and
pooled) per sampling setting, T = 0 first; the per-position acceptance curve that `plot.py` draws."""

from __future__ import annotations

import json
from collections.abc import Sequence

from eval_worker.reports.caveats import caveats
from eval_worker.reports.columns import Column, render, table_width
from eval_worker.reports.conventions import PER_PROMPT, POOLED, TAU_LEGEND, fmt
from eval_worker.reports.run_label import run_label, run_name, run_options
from eval_worker.reports.sampling_settings import by_setting, settings
from schemas.report import EvalReport, ExpectedSummary, SetSummary, TauSummary
from schemas.sampling import GREEDY_SETTING

WIDTH = 120  # the default table fits this many columns; --wide shows every column
_MIN_LABEL = 24  # narrower than this, a run label no longer says which run it is


def by_run(r: EvalReport) -> tuple[str, int, str]:
    """Sort key: run label, then training step, then path."""
    return (run_label(r), r.step if r.step is not None else -1, r.checkpoint_path)


def _per_prompt(s: TauSummary | ExpectedSummary | None) -> str:
    """`3.256±0.120`: the per-prompt mean and its standard error over prompts."""
    if s is None or s.mean_tau is None:
        return "-"
    return fmt(s.mean_tau) + ("" if s.stderr is None else f"±{s.stderr:.3f}")


def _pooled(s: TauSummary | ExpectedSummary | None) -> str:
    return "-" if s is None else fmt(s.tokens_per_round)


def _tau_columns(group: str, name: str, picked: Sequence[TauSummary | ExpectedSummary | None]) -> list[Column]:
    """`per-prompt` and `pooled` of one tau per row, `name` before each heading."""
    return [
        Column(group, f"{name}{PER_PROMPT}", [_per_prompt(s) for s in picked]),
        Column(group, f"{name}{POOLED}", [_pooled(s) for s in picked]),
    ]


def _at(reports: Sequence[EvalReport], setting: str) -> list[SetSummary | None]:
    """Each report's summary at `setting` (None: not measured)."""
    return [by_setting(r.summary).get(setting) for r in reports]


def _setting_columns(setting: str, reports: Sequence[EvalReport]) -> list[Column]:
    """Prompts, chain per-prompt and pooled at one setting."""
    at = _at(reports, setting)
    return [
        Column(setting, "n", [str(s.prompts_evaluated) if s else "-" for s in at]),
        *_tau_columns(setting, "", [s.chain if s else None for s in at]),
    ]


def _middle_cut(text: str, width: int) -> str:
    """`text` in `width` characters: its start and its end (where the options that differ are)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "~" + text[len(text) - (width - 1 - head) :]


def _step_column(reports: Sequence[EvalReport]) -> Column:
    return Column("", "step", ["-" if r.step is None else str(r.step) for r in reports])


def compare_table(reports: Sequence[EvalReport], *, wide: bool = False) -> str:
    """The table (every column with `wide`, else what fits `WIDTH`), the legend and the caveats."""
    ordered = sorted(reports, key=by_run)
    columns = _wide_columns(ordered) if wide else _narrow_columns(ordered)
    lines = render(columns)
    lines += [TAU_LEGEND, "±: standard error of per-prompt over prompts; n: prompts (samples) evaluated"]
    if not wide:
        lines[-1] += "; --wide: layers, trees, sets; --json: all"
        shown = {c.group for c in columns}
        hidden = [s for s in settings(ordered) if s not in shown]
        if hidden:
            lines.append(f"not shown in {WIDTH} columns (--wide): {', '.join(hidden)}")
    elif len(settings(ordered)) > 1 and any(r.summary.trees or r.summary.eagle_trees for r in ordered):
        lines.append(f"trees: walked on greedy ({GREEDY_SETTING}) responses only")
    return "\n".join(lines + [f"warning: {c}" for c in caveats(ordered)])


def _narrow_columns(reports: Sequence[EvalReport]) -> list[Column]:
    """Step, run label and chain tau per setting (as many settings as leave the label readable)."""
    fixed = [_step_column(reports)]
    groups: list[list[Column]] = []
    for setting in settings(reports):
        more = _setting_columns(setting, reports)
        if groups and WIDTH - table_width(fixed + [c for g in [*groups, more] for c in g]) - 2 < _MIN_LABEL:
            break
        groups.append(more)
    labels = [run_label(r) for r in reports]
    room = WIDTH - table_width(fixed + [c for g in groups for c in g]) - 2
    label = Column("", "run", [_middle_cut(s, max(room, _MIN_LABEL)) for s in labels], left=True)
    return [*fixed, label, *(c for g in groups for c in g)]


def _wide_columns(reports: Sequence[EvalReport]) -> list[Column]:
    """Every number: checkpoint, options, layers, storage; chain and probabilistic per setting; trees at
    T = 0; all prompts together where settings mix; each set's chain per setting and trees."""
    columns = [
        _step_column(reports),
        Column("", "run", [run_name(r) for r in reports], left=True),
        Column("", "options", [run_options(r) for r in reports], left=True),
        Column("", "checkpoint", [r.checkpoint_path for r in reports], left=True),
        Column("", "layers", [",".join(map(str, r.target_layer_ids)) for r in reports], left=True),
        Column("", "storage", [r.feature_storage for r in reports], left=True),
    ]
    found = settings(reports)
    for setting in found:
        columns += _setting_columns(setting, reports)
        if setting != GREEDY_SETTING:  # at T = 0 probabilistic drafting is the chain walk itself
            columns += _probabilistic(setting, reports)
    columns += _trees(f"{GREEDY_SETTING} trees", _at(reports, GREEDY_SETTING))
    if len(found) > 1:
        columns += _tau_columns("all prompts, settings mixed", "", [r.summary.chain for r in reports])
    for name in sorted({n for r in reports for n in r.summary.by_set}):
        columns += _set_columns(name, found, reports)
    return columns


def _probabilistic(setting: str, reports: Sequence[EvalReport]) -> list[Column]:
    picked = [s.probabilistic if s else None for s in _at(reports, setting)]
    return _tau_columns(setting, "prob ", picked) if any(picked) else []


def _trees(group: str, at: Sequence[SetSummary | None]) -> list[Column]:
    """Each DDTree budget's and EAGLE tree's tau (trees are walked on greedy responses only)."""
    budgets = sorted({b for s in at if s for b in s.trees})
    shapes = sorted({k for s in at if s for k in s.eagle_trees}, key=lambda k: [int(x) for x in k.split(",")])
    columns = []
    for b in budgets:
        columns += _tau_columns(group, f"ddtree-{b} ", [s.trees.get(b) if s else None for s in at])
    for k in shapes:
        columns += _tau_columns(group, f"eagle-{k} ", [s.eagle_trees.get(k) if s else None for s in at])
    return columns


def _set_columns(name: str, found: Sequence[str], reports: Sequence[EvalReport]) -> list[Column]:
    """One set's chain per setting, and its trees at T = 0."""
    sets = [r.summary.by_set.get(name) for r in reports]
    columns = []
    for setting in found:
        at = [by_setting(s).get(setting) if s else None for s in sets]
        columns += _tau_columns(f"{name} {setting}", "", [s.chain if s else None for s in at])
    return columns + _trees(
        f"{name} {GREEDY_SETTING} trees", [by_setting(s).get(GREEDY_SETTING) if s else None for s in sets]
    )


def compare_json(reports: Sequence[EvalReport]) -> str:
    """Every report's summaries (the per-prompt rounds left out) with its run label, the conventions of
    its two taus and the caveats, as one JSON document."""
    ordered = sorted(reports, key=by_run)
    body = {
        "tau_conventions": {
            "mean_tau": f"{PER_PROMPT}: mean over prompts of each prompt's mean round tau (DFlash, SGLang)",
            "tokens_per_round": f"{POOLED}: total tokens / total rounds = 1 + accepted/drafts (vLLM)",
        },
        "warnings": caveats(ordered),
        "reports": [
            {"run": run_label(r), "run_name": run_name(r), "options": run_options(r)}
            | r.model_dump(mode="json", exclude={"prompts"})
            for r in ordered
        ],
    }
    return json.dumps(body, indent=2)


def max_round_tau(report: EvalReport) -> int:
    """The most a chain round can score: a DFlash block's length, or the steps + 1 of a chain drafter."""
    return report.drafting.longest_round


def acceptance_curve(summary: TauSummary, longest: int) -> list[float]:
    """P(round tau >= k) for k = 2..longest, from the round histogram (k = 1 is every round: always 1)."""
    rounds = summary.total_rounds
    if not rounds:
        return [0.0] * (longest - 1)
    return [sum(n for tau, n in summary.histogram.items() if tau >= k) / rounds for k in range(2, longest + 1)]
