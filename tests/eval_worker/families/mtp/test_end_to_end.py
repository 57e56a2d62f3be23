"""An MTP head evaluated against a real cache server on its own target (a tiny DeepSeek-V3 whose head sits
in its checkpoint): `eval-worker evaluate TARGET_DIR` and the same spec as a job give one report, whose
rounds are the independent live loop's (`testing/mtp_reference.py`) on every prompt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import EvalSpec, MtpOptions
from schemas.jobs import JobStatus
from schemas.report import EvalReport, MtpDrafting
from testing.mtp_reference import MtpReference
from testing.mtp_targets import Tuning, save_deepseek_v3_mtp
from testing.servers import running_server

pytestmark = pytest.mark.slow
PROMPTS = [[5, 17, 3, 99, 250], [1, 2, 3, 4], [400, 7, 7, 7, 31, 8, 2], [60, 61, 62]]
NEW_TOKENS, STEPS = 20, 3


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The cache server on the target (its root holds the target directory), prompts computed."""
    root = tmp_path_factory.mktemp("runs")
    target = save_deepseek_v3_mtp(root / "deepseek", tuning=Tuning(0.1, 6.0, 3.0))
    store = tmp_path_factory.mktemp("store")
    with running_server(target, store, "--checkpoint-root", str(root)) as url, CacheClient(url) as client:
        specs = [{"token_ids": p} for p in PROMPTS]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=NEW_TOKENS)])
        yield url, target


def test_evaluate_and_a_job_give_the_live_loops_rounds(served: tuple[str, Path], tmp_path: Path) -> None:
    url, target = served
    local = tmp_path / "local.json"
    flags = ["--all-prompts", "--steps", str(STEPS), "--device", "cpu"]
    assert main(["evaluate", str(target), "--server", url, *flags, "--out", str(local)]) == 0
    report = EvalReport.model_validate_json(local.read_text())
    assert (report.drafter_family, report.layout, report.target_layer_ids) == ("mtp", "deepseek", [1])
    assert report.drafting == MtpDrafting(steps=STEPS, mtp_layers=1, layout="deepseek")

    reference = MtpReference(target)
    live = {tuple(p): reference.run(p, NEW_TOKENS, STEPS) for p in PROMPTS}
    with CacheClient(url) as client:
        states = {s.prompt_id: s for s in client.prompts()}
        for prompt in report.prompts:
            tokens = client.hidden(prompt.prompt_id, [1]).token_ids.tolist()
            run = live[tuple(tokens[: prompt.prompt_len])]
            assert tokens[prompt.prompt_len :] == run.tokens  # the cached response is the target's greedy one
            assert prompt.chain.round_taus == run.round_taus()
        assert len(states) == len(PROMPTS)
        assert sum(a for run in live.values() for a in run.accepted) > 0

        jobs = JobsClient(client)
        spec = EvalSpec(family_options=MtpOptions(steps=STEPS))
        job = jobs.submit("deepseek", spec=spec)
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        final = jobs.job(job.job_id)
        assert final.status == JobStatus.done, final.error
        from_job = jobs.report(job.job_id)
    assert [p.chain for p in sorted(from_job.prompts, key=lambda p: p.prompt_id)] == [
        p.chain for p in sorted(report.prompts, key=lambda p: p.prompt_id)
    ]
    assert from_job.drafting == report.drafting
