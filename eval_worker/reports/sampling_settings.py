"""Reports' numbers per sampling setting of the responses, T = 0 first: tables and plots show each setting
apart, never one tau that averages greedy and sampled responses unlabelled."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.report import EvalReport, SetSummary
from schemas.sampling import GREEDY_SETTING, setting_temperature


def _ordered(found: set[str] | dict[str, SetSummary]) -> list[str]:
    return sorted(found, key=lambda k: (setting_temperature(k), k))


def by_setting(s: SetSummary) -> dict[str, SetSummary]:
    """A summary per sampling setting of its responses, T = 0 first (a summary from before settings
    were recorded: its whole self at T = 0)."""
    found = s.by_sampling or {GREEDY_SETTING: s}
    return {k: found[k] for k in _ordered(found)}


def settings(reports: Sequence[EvalReport]) -> list[str]:
    """Every sampling setting any report measured, T = 0 first."""
    return _ordered({k for r in reports for k in by_setting(r.summary)})
