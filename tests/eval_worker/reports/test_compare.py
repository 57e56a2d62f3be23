"""`compare`: the table and the acceptance curve come straight from the reports' numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_worker.reports.compare import acceptance_curve, compare_table
from eval_worker.reports.plot import plot
from eval_worker.scoring.summary import round_taus, summarize
from schemas.report import EvalReport, EvalSummary, PromptEval


def _report(step: int, rounds: list[list[int]], tree_rounds: list[list[int]]) -> EvalReport:
    chain = [round_taus(r) for r in rounds]
    trees = [round_taus(r) for r in tree_rounds]
    prompts = [
        PromptEval(prompt_id=f"p{i}", prompt_len=3, num_tokens=3 + sum(r), chain=c, trees={8: t})
        for i, (r, c, t) in enumerate(zip(rounds, chain, trees, strict=True))
    ]
    summary = EvalSummary(
        chain=summarize(chain), trees={8: summarize(trees)}, prompts_evaluated=len(prompts), wall_time_s=1.0
    )
    return EvalReport(
        checkpoint_path=f"/ckpt/step_{step}.pt",
        format="torch_dict",
        step=step,
        epoch=0,
        target_name="t",
        target_fingerprint="fp",
        target_layer_ids=[1, 3, 5],
        layer_ids_source="checkpoint",
        block_size=4,
        mask_token_id=511,
        tree_budgets=[8],
        device="cpu",
        dtype="float32",
        prompts=prompts,
        summary=summary,
    )


def test_table_is_sorted_by_step_with_each_tau(tmp_path: Path) -> None:
    late = _report(200, [[4, 4, 1], [2]], [[4, 4, 2], [3]])
    early = _report(30, [[1, 1, 2], [1]], [[2, 1, 2], [1]])
    lines = compare_table([late, early]).splitlines()
    assert "ddtree-8" in lines[0]
    assert lines[1].split()[0] == "30" and lines[2].split()[0] == "200"
    # step 200: prompt means 3.0 and 2.0 -> 2.5; DDTree-8: 10/3 and 3 -> 3.1667
    assert lines[2].split()[-2:] == ["2.500", "3.167"]
    assert "[1, 3, 5]" in lines[2]


def test_acceptance_curve_from_histogram() -> None:
    summary = _report(1, [[4, 4, 1], [2]], [[1, 1, 1], [1]]).summary.chain
    assert acceptance_curve(summary, 4) == pytest.approx([1.0, 0.75, 0.5, 0.5])


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "tau.png"
    plot([_report(30, [[1, 2]], [[2, 2]]), _report(200, [[4, 3]], [[4, 4]])], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
