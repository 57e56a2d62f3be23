"""Prompt sets through the real server: a job on two sets reports each set exactly as evaluating that
set alone does, and `compare` shows one column group per set."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobStatus
from schemas.report import EvalReport
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import Sequences

pytestmark = pytest.mark.slow


def test_a_job_on_two_sets_equals_each_set_alone(
    tiny_target: Path,
    tmp_path: Path,
    sequences: Sequences,
    trained_drafter: DFlashDrafter,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    root = tmp_path / "runs"
    ckpt = save_torch_checkpoint(root / "step_5.pt", trained_drafter, global_step=5, epoch=0)
    specs = sequences.prompt_specs()
    in_a, in_b = {0, 1, 2, 3, 4}, {3, 4, 5, 6, 7}  # two prompts in both
    for i, spec in enumerate(specs):
        spec["sets"] = [name for name, members in (("a", in_a), ("b", in_b)) if i in members]
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            ids = [p.prompt_id for p in client.register(specs)]
            client.wait_ready(ids)
            assert {s.name: s.total for s in client.sets().sets} == {"a": 5, "b": 5}
            jobs = JobsClient(client)
            job = jobs.submit(
                "step_5.pt", spec=EvalSpec(sets=["a", "b"], family_options=DFlashOptions(tree_budgets=[3]))
            )
            stop = threading.Event()
            settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
            worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
            worker.start()
            try:
                assert jobs.wait(job.job_id, timeout_s=120, poll_s=0.1).status == JobStatus.done
            finally:
                stop.set()
                worker.join()
            report = jobs.report(job.job_id)
        alone = {}
        for name in ("a", "b"):
            out = tmp_path / f"{name}.json"
            argv = ["evaluate", str(ckpt), "--server", url, "--set", name, "--tree-budget", "3", "--device", "cpu"]
            assert main([*argv, "--out", str(out)]) == 0
            alone[name] = EvalReport.model_validate_json(out.read_text())
        capsys.readouterr()
        assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--wide"]) == 0
        table = capsys.readouterr().out
    assert report.summary.prompts_evaluated == 8 and sorted(report.summary.by_set) == ["a", "b"]
    for name, members in (("a", in_a), ("b", in_b)):
        mine, theirs = report.summary.by_set[name], alone[name].summary
        assert mine.prompts_evaluated == theirs.prompts_evaluated == len(members)
        assert (mine.chain, mine.trees) == (theirs.chain, theirs.trees)
        assert alone[name].summary.by_set[name].chain == theirs.chain  # alone, the set is the whole run
    head = table.splitlines()[0]  # a column group per set: its chain per setting, its trees
    assert "a T=0" in head and "b T=0 trees" in head and "ddtree-3 per-prompt" in table
