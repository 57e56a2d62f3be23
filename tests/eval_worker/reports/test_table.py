"""The terminal report says each family's drafting from its own block ("DFlash" labels DFlash alone), and
each tau both ways, per sampling setting, T = 0 first."""

from __future__ import annotations

import pytest

from eval_worker.reports.conventions import TAU_LEGEND
from eval_worker.reports.table import format_report
from schemas.report import DFlashDrafting, Drafting, Eagle3Drafting, EvalReport, MtpDrafting, PromptEval
from testing.leaderboard_reports import leaderboard_reports
from tests.cache_server.jobs_helpers import report_body


@pytest.mark.parametrize(
    ("drafting", "line"),
    [
        (DFlashDrafting(block_size=16, mask_token_id=5), "drafter     DFlash, block size 16, mask token 5"),
        (Eagle3Drafting(steps=3, draft_vocab_size=32000), "EAGLE-3 (eagle layout), 3 chain steps, draft vocab 32000"),
        (
            MtpDrafting(steps=2, mtp_layers=1, layout="deepseek"),
            "MTP (deepseek layout), 2 chain steps over 1 MTP layers",
        ),
    ],
)
def test_each_family_has_its_own_line(drafting: Drafting, line: str) -> None:
    body = report_body() | {"drafter_family": drafting.family, "layout": "eagle", "drafting": drafting.model_dump()}
    text = format_report(EvalReport.model_validate(body))
    assert line in text
    assert ("DFlash" in text.replace(TAU_LEGEND, "")) == (drafting.family == "dflash")  # the legend names conventions


def test_keys_accepted_as_inert_and_warnings_are_shown() -> None:
    body = report_body() | {"inert_config_keys": ["wandb_id"], "warnings": ["t2d is ignored by vLLM"]}
    lines = format_report(EvalReport.model_validate(body)).splitlines()
    assert "inert       config keys accepted as inert: wandb_id" in lines
    assert "warning     t2d is ignored by vLLM" in lines


def _both(prompts: list[PromptEval]) -> tuple[str, str]:
    """Per-prompt and pooled tau from the round taus themselves."""
    rounds = [p.chain.round_taus for p in prompts]
    per_prompt = sum(sum(r) / len(r) for r in rounds) / len(rounds)
    return f"{per_prompt:.3f}", f"{sum(map(sum, rounds)) / sum(map(len, rounds)):.3f}"


def test_each_setting_shows_both_taus_and_the_mixed_rows_are_labelled() -> None:
    report = leaderboard_reports()[1]  # 8 greedy prompts, 16 samples at T=0.6 and at T=1
    lines = format_report(report).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("drafts"))
    assert lines[head].split()[:4] == ["drafts", "per-prompt", "s.e.", "pooled"]
    blocks = [line for line in lines[head:] if line and not line.startswith((" ", "drafts", "by "))]
    assert blocks[:4] == ["T=0", "T=0.6 top_p=0.95", "T=1", "all prompts, settings mixed"]
    greedy = [p for p in report.prompts if p.sampling is None]
    t1 = [p for p in report.prompts if p.sampling is not None and p.sampling.temperature == 1]
    for block, prompts in [("T=0", greedy), ("T=1", t1), ("all prompts, settings mixed", report.prompts)]:
        chain = lines[lines.index(block) + 1].split()
        assert chain[0] == "chain" and (chain[1], chain[3]) == _both(prompts)
    assert TAU_LEGEND in lines and "1 + accepted/drafts (vLLM)" in TAU_LEGEND and "(DFlash, SGLang)" in TAU_LEGEND
