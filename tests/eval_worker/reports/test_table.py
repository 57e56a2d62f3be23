"""The terminal report says each family's drafting from its own block: "DFlash" labels DFlash alone."""

from __future__ import annotations

import pytest

from eval_worker.reports.table import format_report
from schemas.report import DFlashDrafting, Drafting, Eagle3Drafting, EvalReport, MtpDrafting
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
    assert ("DFlash" in text) == (drafting.family == "dflash")


def test_keys_accepted_as_inert_and_warnings_are_shown() -> None:
    body = report_body() | {"inert_config_keys": ["wandb_id"], "warnings": ["t2d is ignored by vLLM"]}
    lines = format_report(EvalReport.model_validate(body)).splitlines()
    assert "inert       config keys accepted as inert: wandb_id" in lines
    assert "warning     t2d is ignored by vLLM" in lines
