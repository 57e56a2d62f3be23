"""`compare`: the table, its caveats and the acceptance curve come straight from the reports' numbers; the
default table fits 120 columns with a leaderboard's worth of reports; each tau is shown both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_worker.cli import main
from eval_worker.reports.compare import WIDTH, acceptance_curve, compare_json, compare_table
from eval_worker.scoring.summary import round_taus, summarize, summarize_set
from schemas.report import EvalReport, EvalSummary, PromptEval
from schemas.sampling import SamplingParams
from testing.leaderboard_reports import leaderboard_reports


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


def _per_prompt(rounds: list[list[int]]) -> float:
    return sum(sum(r) / len(r) for r in rounds) / len(rounds)


def _pooled(rounds: list[list[int]]) -> float:
    return sum(map(sum, rounds)) / sum(map(len, rounds))


def test_table_is_sorted_by_step_with_each_tau_both_ways() -> None:
    rounds = [[4, 4, 1], [2]]
    late = _report(200, rounds, [[4, 4, 2], [3]])
    early = _report(30, [[1, 1, 2], [1]], [[2, 1, 2], [1]])
    lines = compare_table([late, early]).splitlines()
    assert lines[1].split() == ["step", "run", "n", "per-prompt", "pooled"]
    assert lines[2].split()[0] == "30" and lines[3].split()[0] == "200"
    # step 200: prompt means 3.0 and 2.0 -> per-prompt 2.5 (s.e. |3 - 2| / 2 = 0.5); pooled 11 tokens / 4 rounds
    assert (_per_prompt(rounds), _pooled(rounds)) == (2.5, 2.75)
    assert lines[3].split()[-3:] == ["2", "2.500±0.500", "2.750"]
    assert "per-prompt: mean of each prompt's mean round tau (DFlash, SGLang)" in lines[4]
    assert "pooled: tokens/rounds = 1 + accepted/drafts (vLLM)" in lines[4]
    wide = compare_table([late, early], wide=True).splitlines()
    assert wide[1].endswith("ddtree-8 per-prompt  ddtree-8 pooled")  # DDTree-8: 10/3 and 3; 13/4
    assert wide[3].split()[-2:] == ["3.167±0.167", "3.250"] and "1,3,5" in wide[3]


def test_a_leaderboard_fits_120_columns_and_tells_each_run_apart() -> None:
    reports = leaderboard_reports()
    assert len(reports) == 11 and len({r.drafter_family for r in reports}) == 3
    lines = compare_table(reports).splitlines()
    assert max(map(len, lines)) <= WIDTH, max(lines, key=len)
    assert lines[0].split() == ["T=0", "T=0.6", "top_p=0.95", "T=1"]  # each setting, T = 0 first
    rows = lines[2:13]
    # one checkpoint (eagle3_step_200) evaluated with 5 and with 6 steps: two rows, two labels
    assert sum("eagle3: EAGLE-3 5 steps, tree 4,3,16" in row and row.split()[0] == "200" for row in rows) == 1
    assert sum("eagle3: EAGLE-3 6 steps" in row for row in rows) == 1
    assert sum("mtp: MTP 1 step " in row for row in rows) == 1 and sum("mtp: MTP 3 steps" in row for row in rows) == 2
    assert "dflash-b: DFlash block 16, probabilistic" in rows[3]


def test_settings_are_never_averaged_unlabelled() -> None:
    """A report over greedy and sampled prompts: each setting's taus, the mixed one only in --wide, labelled."""
    greedy, sampled = [[4, 4], [2, 2]], [[2, 2], [4, 4], [1], [1, 1]]
    report = _sampled_report(100, greedy, sampled)
    mixed = report.summary.chain.mean_tau
    assert mixed is not None
    narrow = compare_table([report])
    row = narrow.splitlines()[2].split()
    t0 = [f"{_per_prompt(greedy):.3f}±1.000", f"{_pooled(greedy):.3f}"]
    t06 = [f"{_per_prompt(sampled):.3f}±1.000", f"{_pooled(sampled):.3f}"]
    assert row[-6:] == ["2", *t0, "4", *t06] == ["2", "3.000±1.000", "3.000", "4", "2.000±1.000", "2.143"]
    assert f"{mixed:.3f}" not in narrow  # 2.333: greedy and sampled prompts averaged together
    wide = compare_table([report], wide=True).splitlines()
    assert "all prompts, settings mixed" in wide[0]
    at = wide[0].index("all prompts, settings mixed")
    assert wide[2][at:].split()[0].startswith(f"{mixed:.3f}±")


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


def test_sampled_settings_standard_error_is_over_prompts() -> None:
    # T=0.6: prompt p0's samples score 2 and 4 (mean 3), p1's 1 and 1 (mean 1): tau 2.0, and the standard
    # error is over the two prompts, the samples of each averaged first: |3 - 1| / 2 = 1.0
    report = _sampled_report(100, [[4, 4], [2, 2]], [[2, 2], [4, 4], [1], [1, 1]])
    t06 = report.summary.by_sampling["T=0.6 top_p=0.95"].chain
    assert (t06.mean_tau, t06.stderr, t06.prompts_evaluated) == (2.0, 1.0, 4)


def test_reports_over_other_prompts_are_compared_with_a_warning() -> None:
    a = _report(100, [[4, 4, 1], [2]], [[1], [1]])
    fewer = _report(200, [[4, 4, 1]], [[1]])
    assert not [line for line in compare_table([a, a]).splitlines() if line.startswith("warning")]
    warned = [line for line in compare_table([a, fewer]).splitlines() if line.startswith("warning")]
    assert warned == [
        "warning: T=0: these reports are over different numbers of prompts "
        "(1 in ckpt: DFlash block 4, ddtree 8 step 200; 2 in ckpt: DFlash block 4, ddtree 8 step 100): not comparable"
    ]
    other = a.model_copy(update={"prompts": [p.model_copy(update={"prompt_id": "q" + p.prompt_id}) for p in a.prompts]})
    warned = [line for line in compare_table([a, other]).splitlines() if line.startswith("warning")]
    assert warned == ["warning: T=0: these reports are over different prompts (as many of each): not comparable"]
    sampled = _sampled_report(300, [[4, 4], [2, 2]], [[2, 2], [4, 4]])
    warned = [line for line in compare_table([a, sampled]).splitlines() if line.startswith("warning")]
    assert "warning: T=0.6 top_p=0.95: not measured by ckpt: DFlash block 4, ddtree 8 step 100" in warned


def test_json_has_every_summary_with_its_run_and_the_conventions() -> None:
    reports = leaderboard_reports()
    body = json.loads(compare_json(reports))
    assert set(body["tau_conventions"]) == {"mean_tau", "tokens_per_round"}
    assert body["tau_conventions"]["tokens_per_round"].startswith("pooled: ")
    runs = {(r["run"], r["step"]) for r in body["reports"]}
    assert len(runs) == len(reports) and ("eagle3: EAGLE-3 6 steps", 200) in runs
    first = EvalReport.model_validate(
        {k: v for k, v in body["reports"][0].items() if k not in {"run", "run_name", "options"}} | {"prompts": []}
    )
    assert first.summary.by_set and first.summary.by_sampling["T=1"].chain.tokens_per_round is not None


def test_the_command_prints_narrow_wide_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for i, r in enumerate(leaderboard_reports()[:4]):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(r.model_dump_json())
    files = [str(p) for p in paths]
    assert main(["compare", *files]) == 0
    assert max(map(len, capsys.readouterr().out.splitlines())) <= WIDTH
    assert main(["compare", *files, "--wide"]) == 0
    assert "ddtree-8 pooled" in capsys.readouterr().out
    assert main(["compare", *files, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["reports"]) == 4


def test_acceptance_curve_from_histogram_starts_at_two_tokens() -> None:
    summary = _report(1, [[4, 4, 1], [2]], [[1, 1, 1], [1]]).summary.chain
    assert acceptance_curve(summary, 4) == pytest.approx([0.75, 0.5, 0.5])  # k = 2, 3, 4 (k = 1 is always 1)


def test_settings_beyond_120_columns_are_named_for_wide() -> None:
    sampled = [SamplingParams(temperature=t, seed=0) for t in (0.2, 0.4, 0.6, 0.8, 1.0)]
    reports = leaderboard_reports(sampled=sampled)
    lines = compare_table(reports).splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert lines[0].split() == ["T=0", "T=0.2", "T=0.4"]  # T = 0 first, then by temperature
    assert "not shown in 120 columns (--wide): T=0.6, T=0.8, T=1" in lines
    assert compare_table(reports, wide=True).splitlines()[0].split()[:6] == [
        "T=0",
        "T=0.2",
        "T=0.4",
        "T=0.6",
        "T=0.8",
        "T=1",
    ]
