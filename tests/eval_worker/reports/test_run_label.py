"""A run's label: the checkpoint's name without its step, and the options it was evaluated with."""

from __future__ import annotations

import pytest

from eval_worker.reports.run_label import run_label, run_name
from schemas.report import DFlashDrafting, Drafting, Eagle3Drafting, EvalReport, MtpDrafting
from tests.cache_server.jobs_helpers import report_body


def _report(path: str, step: int | None, drafting: Drafting, **more: object) -> EvalReport:
    body = report_body(checkpoint=path) | {"step": step, "drafter_family": drafting.family}
    return EvalReport.model_validate(body | {"drafting": drafting.model_dump()} | more)


@pytest.mark.parametrize(
    ("path", "step", "name"),
    [
        ("demo-out/runs/dflash_step_200", 200, "dflash"),
        ("/runs/v4/step_200.pt", 200, "v4"),
        ("/runs/v4/checkpoint-1200", 1200, "v4"),
        ("/runs/v4/final", 1200, "final"),
        ("/runs/v4/model-200", None, "model-200"),
    ],
)
def test_the_run_name_leaves_the_step_out(path: str, step: int | None, name: str) -> None:
    assert run_name(_report(path, step, DFlashDrafting(block_size=8))) == name


def test_one_checkpoint_with_other_options_gets_other_labels() -> None:
    path = "runs/eagle3_step_200"
    five = _report(
        path, 200, Eagle3Drafting(steps=5, eagle_trees=["10,7,60"]), draft_sampling=["greedy", "probabilistic"]
    )
    six = _report(path, 200, Eagle3Drafting(steps=6))
    assert run_label(five) == "eagle3: EAGLE-3 5 steps, tree 10,7,60, probabilistic"
    assert run_label(six) == "eagle3: EAGLE-3 6 steps"
    assert run_label(_report("runs/mtp_step_200", 200, MtpDrafting(steps=1, mtp_layers=1, layout="deepseek"))) == (
        "mtp: MTP 1 step"
    )
    fp8 = _report(
        "a/step_3",
        3,
        DFlashDrafting(block_size=16, tree_budgets=[8, 32]),
        feature_storage="float8_e4m3fn per-token scale",
        layer_ids_source="override",
    )
    assert run_label(fp8) == "a: DFlash block 16, ddtree 8,32, float8_e4m3fn, layers 1,3"
