"""`compare`: the table and the acceptance curve come straight from the reports' numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_worker.reports.compare import acceptance_curve, compare_table
from eval_worker.reports.plot import plot
from eval_worker.scoring.summary import round_taus, summarize, summarize_set
from schemas.report import EvalReport, EvalSummary, PromptEval
from schemas.sampling import SamplingParams


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
    # s.e. of the chain's mean over the two prompts: |3.0 - 2.0| / 2 = 0.5
    assert lines[2].split()[-3:] == ["2.500", "0.500", "3.167"]
    assert "[1, 3, 5]" in lines[2]


def test_acceptance_curve_from_histogram() -> None:
    summary = _report(1, [[4, 4, 1], [2]], [[1, 1, 1], [1]]).summary.chain
    assert acceptance_curve(summary, 4) == pytest.approx([1.0, 0.75, 0.5, 0.5])


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "tau.png"
    plot([_report(30, [[1, 2]], [[2, 2]]), _report(200, [[4, 3]], [[4, 4]])], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _sampled_report(step: int, greedy: list[list[int]], sampled: list[list[int]]) -> EvalReport:
    """Prompts at T = 0 and at T = 0.6 (top-p 0.95), two samples of each sampled prompt."""
    setting = SamplingParams(temperature=0.6, top_p=0.95, seed=0)
    prompts = [
        PromptEval(prompt_id=f"g{i}", prompt_len=3, num_tokens=3 + sum(r), chain=round_taus(r), prompt_sha256=f"p{i}")
        for i, r in enumerate(greedy)
    ] + [
        PromptEval(
            prompt_id=f"s{i}",
            prompt_len=3,
            num_tokens=3 + sum(r),
            chain=round_taus(r),
            sampling=setting.model_copy(update={"seed": i}),
            prompt_sha256=f"p{i // 2}",
        )
        for i, r in enumerate(sampled)
    ]
    report = _report(step, [[1]], [[1]])
    summary = EvalSummary(**dict(summarize_set(prompts, [], [])), wall_time_s=1.0)
    return report.model_copy(update={"prompts": prompts, "summary": summary, "tree_budgets": []})


def test_sampled_settings_get_their_own_columns_with_standard_errors(tmp_path: Path) -> None:
    # T=0.6: prompt p0's samples score 2 and 4 (mean 3), p1's 1 and 1 (mean 1): tau 2.0, and the standard
    # error is over the two prompts, the samples of each averaged first: |3 - 1| / 2 = 1.0
    report = _sampled_report(100, [[4, 4], [2, 2]], [[2, 2], [4, 4], [1], [1, 1]])
    lines = compare_table([report]).splitlines()
    assert "T=0:chain" in lines[0] and "T=0.6,top_p=0.95:chain" in lines[0] and "T=0.6,top_p=0.95:s.e." in lines[0]
    assert lines[1].split()[-4:] == ["3.000", "1.000", "2.000", "1.000"]  # T=0 tau, s.e.; T=0.6 tau, s.e.
    t06 = report.summary.by_sampling["T=0.6 top_p=0.95"].chain
    assert (t06.mean_tau, t06.stderr, t06.prompts_evaluated) == (2.0, 1.0, 4)
    out = tmp_path / "tau.png"
    plot([report, _sampled_report(200, [[4, 4]], [[4, 4], [4, 2]])], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
