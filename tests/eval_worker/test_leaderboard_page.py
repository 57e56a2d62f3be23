"""The leaderboard page (`GET /`) in a real browser: headless Chromium loads it from one real server holding
eleven finished jobs - three a real worker ran (one checkpoint twice, with other options), eight more
of other families and options handed in through the jobs protocol - on two sets, prompts in no set and
three sampling settings; the rendered rows carry the reports' numbers in both tau conventions, per set
too, and the page stays readable."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cache_server.client import CacheClient, JobsClient
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobStatus
from schemas.prompts import GenerateSpec, SetList
from schemas.report import DFlashDrafting, EvalReport
from testing.browser import CHROMIUM, headless
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import Sequences

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it with apt-get)"),
]
SETTINGS = ["T=0", "T=0.6 top_p=0.95", "T=1"]
SAMPLED = {"T=0.6 top_p=0.95": 0.45, "T=1": 0.25}  # the handed-in runs' acceptance there, against T=0
EMPTY_ZIP = b"PK\x05\x06" + b"\0" * 18  # a valid torch archive outline: these jobs' reports are handed in


@dataclass(frozen=True)
class Variant:
    """A job of another family or options, its report derived from a real one with taus scaled by `factor`."""

    checkpoint: str
    step: int
    drafting: dict[str, Any]
    factor: float
    probabilistic: bool = False
    sets: tuple[str, ...] = ("gsm8k", "code")


# Submitted first: the MTP run over one set only is the first report, as a run that skipped a set may be.
VARIANTS = [
    Variant(
        "mtp-head/step_800.pt",
        800,
        {"family": "mtp", "steps": 3, "mtp_layers": 1, "layout": "qwen3_5"},
        0.75,
        sets=("code",),
    ),
    Variant("mtp-head/step_800.pt", 800, {"family": "mtp", "steps": 1, "mtp_layers": 1, "layout": "qwen3_5"}, 0.5),
    *(
        Variant(f"dflash-b16/step_{s}.pt", s, {"family": "dflash", "block_size": 16, "tree_budgets": [4, 8]}, f)
        for s, f in ((1000, 0.7), (2000, 0.9), (3000, 1.1))
    ),
    Variant("eagle3-llama/step_500.pt", 500, {"family": "eagle3", "steps": 5, "eagle_trees": ["4,3,16"]}, 0.8, True),
    Variant("eagle3-llama/step_1000.pt", 1000, {"family": "eagle3", "steps": 5, "eagle_trees": ["4,3,16"]}, 1.0, True),
    Variant("eagle3-llama/step_1000.pt", 1000, {"family": "eagle3", "steps": 6, "eagle_trees": ["4,3,16"]}, 1.05, True),
]


def _scaled(node: Any, factor: float) -> Any:
    """Every tau under `node` (a report summary's JSON) moved away from 1 by `factor`."""
    if not isinstance(node, dict):
        return node
    out = {k: _scaled(v, factor) for k, v in node.items()}
    for key in ("mean_tau", "tokens_per_round"):
        if out.get(key) is not None:
            out[key] = 1 + (out[key] - 1) * factor
    if out.get("stderr") is not None:
        out["stderr"] *= factor
    if "histogram" in out:  # each round's accepted drafts scaled alike, its total tokens with them
        hist: dict[int, int] = {}
        for tau, n in out["histogram"].items():
            moved = 1 + round((int(tau) - 1) * factor)
            hist[moved] = hist.get(moved, 0) + n
        out["histogram"], out["total_tokens"] = hist, sum(t * n for t, n in hist.items())
    return out


def _retreed(node: Any, v: Variant) -> Any:
    """Each set summary under `node` with the variant's trees (derived from the walked ones) and drafting."""
    if not isinstance(node, dict):
        return node
    out = {k: _retreed(v_, v) for k, v_ in node.items()}
    for setting, shrink in SAMPLED.items():  # sampled responses accept less than greedy ones
        if setting in out.get("by_sampling", {}):
            at, greedy = out["by_sampling"][setting], out["by_sampling"]["T=0"]
            at["chain"] = _scaled(greedy["chain"], shrink)
            if at["probabilistic"]:
                expected = _scaled(greedy["chain"], shrink * 1.15)
                at["probabilistic"] = {k: expected[k] for k in at["probabilistic"]}
    if "chain" in out:
        base = next(iter(out["trees"].values()), None)
        budgets, eagle = v.drafting.get("tree_budgets", []), v.drafting.get("eagle_trees", [])
        out["trees"] = {b: _scaled(base, 1 + i / 10) for i, b in enumerate(budgets)} if base else {}
        out["eagle_trees"] = {k: _scaled(base, 1.2) for k in eagle} if base else {}
        out["probabilistic"] = out["probabilistic"] if v.probabilistic else None
    return out


def variant_report(real: EvalReport, v: Variant) -> EvalReport:
    body = real.model_dump(mode="json")
    summary = _retreed(_scaled(body["summary"], v.factor), v)
    summary["by_set"] = {k: s for k, s in summary["by_set"].items() if k in v.sets}
    family = v.drafting["family"]
    modes = ["greedy", "probabilistic"] if v.probabilistic else ["greedy"]
    layers = {"mtp": [5], "eagle3": [1, 2, 3]}.get(family, body["target_layer_ids"])
    return EvalReport.model_validate(
        {
            **body,
            "checkpoint_path": v.checkpoint,
            "drafter_family": family,
            "layout": "eagle" if family == "eagle3" else "dflash",
            "drafting": v.drafting,
            "draft_sampling": modes,
            "step": v.step,
            "target_layer_ids": layers,
            "summary": summary,
        }
    )


@dataclass(frozen=True)
class Board:
    url: str
    reports: dict[str, EvalReport]  # job id -> report
    sets: SetList
    dom: str  # the page of all prompts as Chromium renders it


def _register(client: CacheClient, sequences: Sequences) -> None:
    """Greedy prompts 0-3 in gsm8k, 4-5 in code, 6-7 in no set; sampled ones at two settings."""
    sets = [["gsm8k"]] * 4 + [["code"]] * 2 + [[]] * 2
    specs = [{**spec, "sets": s} for spec, s in zip(sequences.prompt_specs(), sets, strict=True)]
    client.wait_ready([p.prompt_id for p in client.register(specs)])
    for temperature, top_p, name in ((0.6, 0.95, "code"), (1.0, 1.0, "gsm8k")):
        sampled = GenerateSpec(max_new_tokens=24, temperature=temperature, top_p=top_p, samples=2)
        texts = [{"text": t, "sets": [name]} for t in ("def fib(n):", "The quick brown fox")]
        client.wait_ready([p.prompt_id for p in client.register(texts, generate=sampled)])


def _run_real_jobs(client: CacheClient, url: str, heads: Path) -> list[str]:
    """v1/step_10 and v1/step_20 (that one twice: with probabilistic drafting and another tree) by a worker."""
    jobs, sets = JobsClient(client), ["gsm8k", "code"]
    specs = [
        ("v1/step_10.pt", EvalSpec(sets=sets, family_options=DFlashOptions(tree_budgets=[3]))),
        ("v1/step_20.pt", EvalSpec(sets=sets, family_options=DFlashOptions(tree_budgets=[3]))),
        (
            "v1/step_20.pt",
            EvalSpec(sets=sets, draft_sampling="probabilistic", family_options=DFlashOptions(tree_budgets=[3, 6])),
        ),
    ]
    submitted = [jobs.submit(c, spec=s) for c, s in specs]
    stop = threading.Event()
    settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=heads)
    worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
    worker.start()
    try:
        assert all(jobs.wait(j.job_id, timeout_s=120, poll_s=0.1).status == JobStatus.done for j in submitted)
    finally:
        stop.set()
        worker.join()
    return [j.job_id for j in submitted]


@pytest.fixture(scope="module")
def board(
    tiny_target: Path, tmp_path_factory: pytest.TempPathFactory, sequences: Sequences, trained_drafter: DFlashDrafter
) -> Iterator[Board]:
    tmp = tmp_path_factory.mktemp("board")
    root = tmp / "runs"
    for step in (10, 20):
        save_torch_checkpoint(root / "v1" / f"step_{step}.pt", trained_drafter, global_step=step, epoch=0)
    for v in VARIANTS:
        (root / v.checkpoint).parent.mkdir(parents=True, exist_ok=True)
        (root / v.checkpoint).write_bytes(EMPTY_ZIP)
    with running_server(tiny_target, tmp / "store", "--checkpoint-root", str(root)) as url, CacheClient(url) as client:
        _register(client, sequences)
        jobs = JobsClient(client)
        for v in VARIANTS:  # claimed here and held, so that the worker runs only the real ones
            jobs.submit(v.checkpoint, spec=EvalSpec(sets=list(v.sets)))
        claims = [c for _ in VARIANTS if (c := jobs.claim("fixture", 600)) is not None]
        real = _run_real_jobs(client, url, tmp / "heads")
        reports = {j: jobs.report(j) for j in real}
        for claim, v in zip(claims, VARIANTS, strict=True):
            jobs.complete(claim.job.job_id, claim.lease, variant_report(reports[real[2]], v))
            reports[claim.job.job_id] = jobs.report(claim.job.job_id)
        yield Board(url, reports, client.sets(), headless(url + "/", "--dump-dom", window=(1440, 1400)))


def _rows(dom: str) -> list[tuple[str, str, dict[str, str]]]:
    """Leaderboard rows in order: (job id, run label, {column key: the number shown})."""
    row = r'<tr class="board-row[^"]*" data-job="([^"]+)" data-checkpoint="[^"]+">(.*?)</tr>'
    out = []
    for job, body in re.findall(row, dom):
        run = re.search(r'<td class="l run" title="([^"]*)">', body)  # the family, its options below
        assert run is not None
        taus = dict(re.findall(r'<td class="tau[^"]*" data-kind="([^"]+)">([^<\s]*)', body))
        out.append((job, run.group(1).replace("&amp;", "&"), taus))
    return out


def _real(board: Board, checkpoint: str) -> EvalReport:
    """The first report the real worker wrote for `checkpoint`."""
    return next(r for r in board.reports.values() if r.checkpoint_path.endswith(checkpoint))


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def test_every_setting_has_its_own_per_prompt_and_pooled_columns(board: Board) -> None:
    rows = _rows(board.dom)
    assert {job for job, _, _ in rows} == set(board.reports)
    for job, _, shown in rows:
        summary = board.reports[job].summary
        assert "chain" not in shown and set(summary.by_sampling) == set(SETTINGS)  # no number pools the settings
        for setting, at in summary.by_sampling.items():
            assert shown[f"{setting}|chain|per-prompt"] == _fmt(at.chain.mean_tau)
            assert shown[f"{setting}|chain|pooled"] == _fmt(at.chain.tokens_per_round)
            for budget, tree in at.trees.items():
                assert shown[f"{setting}|trees:{budget}|pooled"] == _fmt(tree.tokens_per_round)
            if at.probabilistic is not None and setting != "T=0":
                assert shown[f"{setting}|probabilistic|per-prompt"] == _fmt(at.probabilistic.mean_tau)
    # the real worker's numbers: the two conventions differ, and the tree was walked on T=0 prompts only
    greedy = _real(board, "v1/step_10.pt").summary.by_sampling["T=0"]
    assert greedy.chain.mean_tau != greedy.chain.tokens_per_round and greedy.trees[3].prompts_evaluated == 6
    settings = re.findall(r'<th class="group" colspan="\d+" data-setting="([^"]+)"', board.dom)
    assert settings == SETTINGS  # T=0 first
    assert 'th class="conv first sorted" data-key="T=0|chain|per-prompt"' in board.dom  # the default sort
    taus = [float(shown["T=0|chain|per-prompt"]) for _, _, shown in rows]
    assert taus == sorted(taus, reverse=True)
    assert "<b>per-prompt</b>" in board.dom and "<b>pooled</b>" in board.dom and "vLLM" in board.dom


def test_runs_of_one_checkpoint_with_other_options_read_apart(board: Board) -> None:
    runs = {(board.reports[job].checkpoint_path, run) for job, run, _ in _rows(board.dom)}
    assert len(runs) == len(board.reports)  # the runs of one checkpoint read apart
    labels = {run for _, run in runs}
    assert {"MTP, 1 step", "MTP, 3 steps"} <= labels  # and singular where it is one
    assert "EAGLE-3, 6 steps · tree 4,3,16 · probabilistic drafting too" in labels
    real = _real(board, "v1/step_20.pt").drafting
    assert isinstance(real, DFlashDrafting)
    assert f"DFlash, block {real.block_size} · ddtree 3,6 · probabilistic drafting too" in labels


def test_the_sets_table_counts_every_prompt(board: Board) -> None:
    for c in board.sets.sets:  # per status, and the target's agreement with the responses, as /sets says
        row = re.search(rf'<tr class="set-row" data-set="{c.name}">(.*?)</tr>', board.dom)
        assert row is not None
        cells = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
        settings = ", ".join(f"{k}: {n}" for k, n in c.settings.items())
        want = [c.name, str(c.total), str(c.ready), "0", "0", str(c.prompts_not_greedy), str(c.greedy_mismatches)]
        assert cells == [*want, settings, "0"]
    assert board.sets.no_set is not None and board.sets.all_prompts is not None
    assert (board.sets.no_set.total, board.sets.all_prompts.total) == (2, 16)
    row = re.search(
        r'<tr class="summary-row no-set" data-set=""><td class="l">in no set</td><td>2</td><td>2</td>', board.dom
    )
    assert row is not None
    assert re.search(r'data-set=""><td class="l">all prompts</td><td>16</td>', board.dom)


def _legend_rows(svg: str) -> list[float]:
    return [float(y) for y in re.findall(r'<g class="legend">.*?<text x="[^"]+" y="([^"]+)"', svg)]


def test_the_charts_read_with_ten_runs(board: Board) -> None:
    tau = re.search(r'<svg id="tau-chart".*?</svg>', board.dom, re.S)
    assert tau is not None
    lines = re.findall(r'<polyline class="run" data-run="([^"]+)"', tau.group(0))
    # one line per run (its options where one run was evaluated with several), at the T=0 setting
    assert {"v1 (ddtree 3)", "v1 (ddtree 3,6 · probabilistic drafting too)", "dflash-b16"} <= set(lines)
    assert {"mtp-head (MTP, 1 step)", "mtp-head (MTP, 3 steps)", "eagle3-llama (EAGLE-3, 5 steps)"} <= set(lines)
    rows = _legend_rows(tau.group(0))
    assert len(rows) == len(lines) and all(b - a >= 14 for a, b in itertools.pairwise(rows))
    assert len(re.findall('class="ytick"', tau.group(0))) >= 4
    curve = re.search(r'<svg id="curve-chart".*?</svg>', board.dom, re.S)
    assert curve is not None and len(re.findall("<polyline", curve.group(0))) == 3  # one curve per setting
    ticks = re.findall(r'class="xtick"[^>]*>([^<]+)<', curve.group(0))
    assert ticks and all(t.isdigit() for t in ticks)


def test_a_set_shows_its_own_rows_and_the_acceptance_of_its_first(board: Board) -> None:
    dom = headless(board.url + "/?set=gsm8k", "--dump-dom", window=(1440, 1400))
    rows = _rows(dom)
    assert {job for job, _, _ in rows} == {j for j, r in board.reports.items() if "gsm8k" in r.summary.by_set}
    first, _, shown = rows[0]
    assert f'data-job="{first}"' in re.findall(r'<tr class="board-row selected" data-job="[^"]+"', dom)[0]
    assert '<polyline class="run" data-run="T=0"' in dom.split('id="curve-chart"')[1]  # not an empty chart
    for job, _, shown in rows:
        at = board.reports[job].summary.by_set["gsm8k"].by_sampling["T=0"]
        assert shown["T=0|chain|per-prompt"] == _fmt(at.chain.mean_tau)
        assert shown["T=0|chain|pooled"] == _fmt(at.chain.tokens_per_round)


def test_the_page_renders_a_screenshot(board: Board, tmp_path: Path) -> None:
    shot = tmp_path / "leaderboard.png"
    headless(board.url + "/", f"--screenshot={shot}", window=(1440, 1400))
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000


def test_the_jobs_table_shows_each_jobs_id_options_times_and_walk(board: Board) -> None:
    job_id = next(j for j, r in board.reports.items() if r.checkpoint_path.endswith("v1/step_10.pt"))
    with CacheClient(board.url) as client:
        job = JobsClient(client).job(job_id)
    row = re.search(rf'<tr class="job-row" data-status="done" data-job="{job_id}">(.*?)</tr>', board.dom)
    assert row is not None and f">{job_id[:8]}</td>" in row.group(1)
    assert '<td class="l options">DFlash, tree_budgets 3, sets gsm8k code</td>' in row.group(1)
    walked = board.reports[job_id].summary.prompts_evaluated  # the walk's final count, as its worker reported it
    assert f'<td class="l progress">{walked}/{walked} prompts, ' in row.group(1)
    assert f'<td class="l">{job.created_at:%Y-%m-%d %H:%M:%S}</td>' in row.group(1)
