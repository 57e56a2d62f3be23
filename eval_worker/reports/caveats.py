"""What a reader must know before comparing reports: other targets, lossy stores, other prompts."""

from __future__ import annotations

from collections.abc import Sequence

from eval_worker.reports.run_label import run_label
from eval_worker.reports.sampling_settings import by_setting, settings
from eval_worker.scoring.summary import setting_of
from schemas.report import EvalReport


def _who(labels: Sequence[str]) -> str:
    shown = ", ".join(labels[:3])
    return shown + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")


def prompt_caveats(reports: Sequence[EvalReport]) -> list[str]:
    """Per sampling setting: reports over other numbers of prompts, or over other prompts (where the
    reports carry their prompts), or that did not measure it at all."""
    out = []
    for setting in settings(reports):
        counts: dict[int, list[str]] = {}
        for r in reports:
            if (s := by_setting(r.summary).get(setting)) is not None:
                counts.setdefault(s.prompts_evaluated, []).append(f"{run_label(r)} step {r.step}")
        missing = [f"{run_label(r)} step {r.step}" for r in reports if setting not in by_setting(r.summary)]
        if len(counts) > 1:
            sizes = "; ".join(f"{n} in {_who(who)}" for n, who in sorted(counts.items()))
            out.append(f"{setting}: these reports are over different numbers of prompts ({sizes}): not comparable")
        elif _different_prompts(reports, setting):
            out.append(f"{setting}: these reports are over different prompts (as many of each): not comparable")
        if missing:
            out.append(f"{setting}: not measured by {_who(missing)}")
    return out


def _different_prompts(reports: Sequence[EvalReport], setting: str) -> bool:
    """Whether the reports that carry their prompts were walked over other prompt ids at `setting`."""
    ids = {
        frozenset(p.prompt_id for p in r.prompts if setting_of(p) == setting)
        for r in reports
        if r.prompts and setting in by_setting(r.summary)
    }
    return len(ids) > 1


def caveats(reports: Sequence[EvalReport]) -> list[str]:
    """Every caveat of comparing these reports, one line each (none: they compare as they stand)."""
    out = prompt_caveats(reports)
    targets = {r.target_fingerprint for r in reports}
    if len(targets) > 1:
        out.append(f"these reports come from {len(targets)} different targets: {sorted(targets)}")
    storages = {r.feature_storage for r in reports}
    if len(storages) > 1:
        out.append(f"these reports read features stored as {sorted(storages)}: a lossy store's tau is not exact")
    return out
