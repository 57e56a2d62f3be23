"""The leaderboard page (`GET /`) in a real browser: headless Chromium loads it from a real server with
finished jobs on two sets, and the rendered rows carry the reports' numbers, per set too."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from cache_server.client import CacheClient, JobsClient
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobStatus
from schemas.prompts import GenerateSpec
from testing.browser import CHROMIUM, headless
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import Sequences

pytestmark = pytest.mark.slow


def _rows(dom: str) -> dict[str, dict[str, str]]:
    """Leaderboard rows: checkpoint -> {column kind: the number shown}."""
    rows = {}
    row = r'<tr class="board-row[^"]*" data-job="[^"]+" data-checkpoint="([^"]+)">(.*?)</tr>'
    for checkpoint, body in re.findall(row, dom):
        rows[checkpoint] = dict(re.findall(r'<td class="tau" data-kind="([^"]+)">([^<\s]*)', body))
    return rows


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it with apt-get)")
def test_the_page_shows_the_reports_in_a_real_browser(
    tiny_target: Path, tmp_path: Path, sequences: Sequences, trained_drafter: DFlashDrafter
) -> None:
    root = tmp_path / "runs"
    for step in (10, 20):
        save_torch_checkpoint(root / "v1" / f"step_{step}.pt", trained_drafter, global_step=step, epoch=0)
    specs = [{**spec, "sets": ["a" if i < 4 else "b"]} for i, spec in enumerate(sequences.prompt_specs())]
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            client.wait_ready([p.prompt_id for p in client.register(specs)])
            # set c: two prompts' responses sampled at T = 0.6 (top-p 0.95), two samples each
            sampled = GenerateSpec(max_new_tokens=24, temperature=0.6, top_p=0.95, samples=2)
            texts = [{"text": t, "sets": ["c"]} for t in ("def fib(n):", "The quick brown fox")]
            client.wait_ready([p.prompt_id for p in client.register(texts, generate=sampled)])
            jobs = JobsClient(client)
            submitted = [
                jobs.submit(
                    f"v1/step_{s}.pt",
                    spec=EvalSpec(sets=["a", "b", "c"], family_options=DFlashOptions(tree_budgets=[3])),
                )
                for s in (10, 20)
            ]
            stop = threading.Event()
            settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
            worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
            worker.start()
            try:
                assert all(jobs.wait(j.job_id, timeout_s=120, poll_s=0.1).status == JobStatus.done for j in submitted)
            finally:
                stop.set()
                worker.join()
            reports = {f"v1/step_{s}.pt": jobs.report(j.job_id) for s, j in zip((10, 20), submitted, strict=True)}
            model = client.model()
            counts = {c.name: c for c in client.sets().sets}

        dom = headless(url + "/", "--dump-dom")
        assert f'<b id="target-name">{model.name}</b>' in dom and model.fingerprint in dom
        assert re.search(r'<tr class="set-row" data-set="a"><td class="l">a</td><td>4</td><td>4</td>', dom)
        for name, c in counts.items():  # the target's agreement with the responses, per set, as /sets says
            row = re.search(rf'data-set="{name}">(.*?)</tr>', dom)
            assert row is not None
            cells = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
            settings = ", ".join(f"{k}: {n}" for k, n in c.settings.items())
            assert cells[-4:] == [str(c.prompts_not_greedy), str(c.greedy_mismatches), settings, "0"]
        assert '<span id="generator">hf</span>' in dom and "float32, stored exact)" in dom
        assert dom.count('<td class="l storage">exact</td>') == 2  # every report's features, as it says
        assert dom.count('class="job-row" data-status="done"') == 2
        for job in submitted:  # the jobs table: id, options, times, and the walk's final count
            row = re.search(rf'<tr class="job-row" data-status="done" data-job="{job.job_id}">(.*?)</tr>', dom)
            assert row is not None and f">{job.job_id[:8]}</td>" in row.group(1)
            assert '<td class="l options">DFlash, tree_budgets 3, sets a b c</td>' in row.group(1)
            assert '<td class="l progress">12/12 prompts, ' in row.group(1)
            assert f'<td class="l">{job.created_at:%Y-%m-%d %H:%M:%S}</td>' in row.group(1)
        shown = _rows(dom)
        assert set(shown) == set(reports)
        for checkpoint, report in reports.items():
            assert shown[checkpoint]["chain"] == f"{report.summary.chain.mean_tau:.3f}"
            assert shown[checkpoint]["trees:3"] == f"{report.summary.trees[3].mean_tau:.3f}"  # T = 0 prompts only
            assert report.summary.trees[3].prompts_evaluated == 8 and report.summary.chain.prompts_evaluated == 12
            for setting, summary in report.summary.by_sampling.items():  # T=0 and T=0.6 top_p=0.95 columns
                assert shown[checkpoint][f"setting:{setting}|chain"] == f"{summary.chain.mean_tau:.3f}"
            assert set(report.summary.by_sampling) == {"T=0", "T=0.6 top_p=0.95"}
        assert dom.count('<td class="l drafting">greedy</td>') == 2
        assert re.search(r"±\d\.\d{3}", dom)  # every tau with its standard error
        for setting in ("T=0", "T=0.6 top_p=0.95"):  # tau vs step per sampling setting
            assert f'<polyline class="run" data-run="v1 {setting}"' in dom
        assert '<polyline id="curve"' in dom

        per_set = _rows(headless(url + "/?set=b", "--dump-dom"))
        for checkpoint, report in reports.items():
            assert per_set[checkpoint]["chain"] == f"{report.summary.by_set['b'].chain.mean_tau:.3f}"

        shot = tmp_path / "leaderboard.png"
        headless(url + "/", f"--screenshot={shot}")
        assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000
