"""Job workers as real processes against a real server: lease expiry after SIGKILL, many workers
and jobs across a server restart, and a refused checkpoint failing at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from cache_server.client import CacheClient, JobsClient
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobState, JobStatus
from testing.checkpoints import save_torch_checkpoint
from testing.servers import HIDDEN_REQUESTS, free_port, running_server, server_metric
from testing.tiny_trainer import tiny_drafter_config

pytestmark = pytest.mark.slow
LEASE_S = "2"


@pytest.fixture(scope="module")
def checkpoints(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkpoints")
    cfg = tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5], block_size=4)
    for step in range(6):
        torch.manual_seed(step)
        save_torch_checkpoint(root / f"step_{step}.pt", DFlashDrafter(cfg, 3), global_step=step, epoch=0)
    return root


def _register(url: str) -> list[str]:
    with CacheClient(url) as client:
        ids = [
            p.prompt_id for p in client.register([{"token_ids": [5 + i, 6, 7]} for i in range(6)], max_new_tokens=40)
        ]
        client.wait_ready(ids, timeout_s=120)
        return ids


@contextmanager
def _worker(url: str, name: str, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [sys.executable, "-m", "eval_worker.cli", "serve", "--server", url, "--name", name]
    cmd += ["--lease-s", LEASE_S, "--poll-interval", "0.2", "--device", "cpu"]
    env = {**os.environ, "EVAL_WORKER_HEADS_CACHE": str(tmp / "heads")}
    with (tmp / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _four_layer_checkpoint(checkpoints: Path, name: str) -> None:
    """`bad/<name>`: step_0 with a 4-layer config for its 3-tap fc, which the loader refuses."""
    (checkpoints / "bad").mkdir(exist_ok=True)
    state = torch.load(checkpoints / "step_0.pt", weights_only=True)
    state["config"]["dflash_config"]["target_layer_ids"] = [1, 2, 3, 4]
    torch.save(state, checkpoints / "bad" / name)


def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_a_killed_workers_job_completes_on_another_worker(tiny_target: Path, checkpoints: Path, tmp_path: Path) -> None:
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(checkpoints)) as url:
        _register(url)
        with CacheClient(url) as client:
            jobs = JobsClient(client)
            job = jobs.submit(
                "step_0.pt", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[512]))
            )  # a few seconds of work: killed mid-way
            with _worker(url, "doomed", tmp_path) as doomed:

                def running_on_doomed() -> bool:
                    state = jobs.job(job.job_id)
                    assert state.status != JobStatus.done, "finished before it could be killed"
                    return state.status == JobStatus.running and state.worker == "doomed"

                _until(running_on_doomed, 60, "the first worker never claimed the job")
                doomed.send_signal(signal.SIGKILL)
                doomed.wait()
            assert jobs.job(job.job_id).status == JobStatus.running  # nobody told the server
            with _worker(url, "rescuer", tmp_path):
                final = jobs.wait(job.job_id, timeout_s=120, poll_s=0.2)
            assert (final.status, final.worker, final.attempts) == (JobStatus.done, "rescuer", 2)
            report = jobs.report(job.job_id)
            assert report.checkpoint_path.endswith("step_0.pt") and report.summary.prompts_evaluated == 6
            assert len(jobs.jobs()) == 1


def test_many_workers_many_jobs_across_a_server_restart(tiny_target: Path, checkpoints: Path, tmp_path: Path) -> None:
    store, port = tmp_path / "store", free_port()
    args = ("--checkpoint-root", str(checkpoints))
    with ExitStack() as workers:
        with running_server(tiny_target, store, *args, port=port) as url:
            _register(url)
            with CacheClient(url) as client:
                submitted = [
                    JobsClient(client).submit(
                        f"step_{i}.pt", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[64]))
                    )
                    for i in range(6)
                ]
            for name in ("w1", "w2", "w3"):
                workers.enter_context(_worker(url, name, tmp_path))
            with CacheClient(url) as client:
                _until(lambda: any(j.status == JobStatus.done for j in JobsClient(client).jobs()), 120, "no job done")
        # the server is down now, with jobs queued and some running; it comes back on the same port
        with running_server(tiny_target, store, *args, port=port) as url, CacheClient(url) as client:
            jobs = JobsClient(client)
            finals: list[JobState] = [jobs.wait(j.job_id, timeout_s=180, poll_s=0.2) for j in submitted]
            assert [f.status for f in finals] == [JobStatus.done] * 6
            assert sorted(j.job_id for j in jobs.jobs()) == sorted(j.job_id for j in submitted)
            steps = sorted(jobs.report(j.job_id).step or 0 for j in submitted)
            assert steps == [0, 1, 2, 3, 4, 5]  # each job's own checkpoint, each reported once
            assert {f.worker for f in finals} <= {"w1", "w2", "w3"}


def test_a_refused_checkpoint_fails_at_once_without_retries(
    tiny_target: Path, checkpoints: Path, tmp_path: Path
) -> None:
    _four_layer_checkpoint(checkpoints, "four_layers.pt")
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(checkpoints)) as url:
        _register(url)
        with CacheClient(url) as client:
            jobs = JobsClient(client)
            job = jobs.submit("bad/four_layers.pt")
            worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
            assert worker.run_one()
            final = jobs.job(job.job_id)
            assert (final.status, final.attempts) == (JobStatus.failed, 1)
            assert final.error is not None and "refused" in final.error and "[1, 2, 3, 4]" in final.error
            assert not worker.run_one()  # nothing left to claim: no retry


def test_a_batch_of_jobs_shares_one_pass_and_each_gets_its_own_outcome(
    tiny_target: Path, checkpoints: Path, tmp_path: Path
) -> None:
    _four_layer_checkpoint(checkpoints, "four_layers_batch.pt")
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(checkpoints)) as url:
        ids = _register(url)
        with CacheClient(url) as client:
            jobs = JobsClient(client)
            good = [
                jobs.submit(f"step_{i}.pt", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[4])))
                for i in range(3)
            ]
            refused = jobs.submit(
                "bad/four_layers_batch.pt", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[4]))
            )
            settings = WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads", max_batch_jobs=4)
            worker = JobWorker(client, settings)
            before = server_metric(url, HIDDEN_REQUESTS)
            assert worker.run_one()  # claims all four at once
            assert server_metric(url, HIDDEN_REQUESTS) - before == len(ids)  # the three good ones read each prompt once
            finals = [jobs.job(j.job_id) for j in good]
            assert [(f.status, f.attempts) for f in finals] == [(JobStatus.done, 1)] * 3
            assert sorted(jobs.report(j.job_id).step or 0 for j in good) == [0, 1, 2]
            failed = jobs.job(refused.job_id)
            assert (failed.status, failed.attempts) == (JobStatus.failed, 1) and "refused" in (failed.error or "")
            before = server_metric(url, HIDDEN_REQUESTS)
            again = jobs.submit("step_3.pt", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[4])))
            assert worker.run_one()  # the next job finds every prompt resident in the worker
            assert server_metric(url, HIDDEN_REQUESTS) == before
            cost = jobs.report(again.job_id).summary.cost
            assert cost is not None and (cost.feature_bytes_fetched, cost.feature_cache_hits) == (0, len(ids))
