"""A report's family fields are its family's own block, and reports written before the blocks load into
theirs: JSON files on disk and the reports jobs stored."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.report import DFlashDrafting, Eagle3Drafting, EvalReport, MtpDrafting
from tests.cache_server.jobs_helpers import flat_report_body, report_body


def test_a_dflash_report_written_flat_loads_into_its_block() -> None:
    old = flat_report_body("dflash")
    assert "drafter_family" not in old  # written before EAGLE-3 too: DFlash by default
    report = EvalReport.model_validate(old)
    assert (report.drafter_family, report.drafting) == (
        "dflash",
        DFlashDrafting(block_size=4, mask_token_id=0, tree_budgets=[8]),
    )
    assert report.drafting.longest_round == 4


def test_an_eagle3_report_written_flat_loads_into_its_block() -> None:
    report = EvalReport.model_validate(flat_report_body("eagle3"))
    assert report.drafting == Eagle3Drafting(steps=3, draft_vocab_size=64, eagle_trees=["4,3,16"])
    assert report.drafting.longest_round == 4
    assert EvalReport.model_validate_json(report.model_dump_json()) == report  # written back with its block


def test_a_block_says_its_family_and_must_agree_with_the_report() -> None:
    mtp = {k: v for k, v in report_body().items() if k != "drafter_family"}
    mtp["drafting"] = {"family": "mtp", "steps": 2, "mtp_layers": 1, "layout": "deepseek"}
    report = EvalReport.model_validate(mtp)
    assert (report.drafter_family, report.drafting) == ("mtp", MtpDrafting(steps=2, mtp_layers=1, layout="deepseek"))
    with pytest.raises(ValidationError, match="a dflash report with a mtp drafting block"):
        EvalReport.model_validate(mtp | {"drafter_family": "dflash"})
    no_family = report_body() | {"drafting": {"block_size": 4, "mask_token_id": 0}}
    assert EvalReport.model_validate(no_family).drafting == DFlashDrafting(block_size=4, mask_token_id=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 3}, r"\['steps'\] do not apply to a dflash report"),
        ({"drafting": {"family": "dflash"}}, r"inside drafting, not beside it"),
    ],
)
def test_flat_fields_that_mean_nothing_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EvalReport.model_validate(flat_report_body("dflash") | change)
