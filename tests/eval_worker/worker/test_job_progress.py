"""A running job says how far its walk is (`GET /jobs/{id}`: prompts walked, rounds, ETA), as the
worker reports it with its lease renewals, and a running job is cancelled by `DELETE`: its worker
stops walking at its next drafter forward and the job ends cancelled. A real server in this process
(uvicorn on loopback) and a real worker over a tiny drafter; the test acts from inside the walk (a
listener on the worker's `WalkProgress`), so nothing waits on a timer to hit the middle of a walk."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from cache_server.api.app import create_app
from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.evaluation.progress import WalkProgress
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.jobs import JobState, JobStatus
from testing.checkpoints import save_torch_checkpoint
from testing.servers import serving_app
from testing.tiny_trainer import tiny_drafter_config
from tests.cache_server.helpers import serve_settings

PROMPTS = 3
LEASE_S = 0.6  # renewed every 0.2 s: the worker reports within the test's wait below


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CacheClient, Path]]:
    """A server taking jobs of `root/step_0.pt`, with PROMPTS ready prompts."""
    tmp = tmp_path_factory.mktemp("progress")
    root = tmp / "runs"
    root.mkdir()
    torch.manual_seed(0)
    cfg = tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5], block_size=4)
    save_torch_checkpoint(root / "step_0.pt", DFlashDrafter(cfg, 3), global_step=0, epoch=0)
    settings = serve_settings(tiny_target, tmp / "store", checkpoint_root=root)
    with serving_app(create_app(settings)) as url, CacheClient(url, timeout=60) as client:
        prompts = [{"token_ids": [5 + i, 6, 7]} for i in range(PROMPTS)]
        ids = [p.prompt_id for p in client.register(prompts, max_new_tokens=24)]
        client.wait_ready(ids, timeout_s=120)
        yield client, tmp


def _until(check: Callable[[], JobState | None], what: str, timeout_s: float = 60) -> JobState:
    deadline = time.monotonic() + timeout_s
    while (state := check()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)
    return state


def _worker(client: CacheClient, tmp: Path, inside: Callable[[WalkProgress], None]) -> JobWorker:
    """A worker whose walks call `inside` once, after their first drafter forward."""

    def progress() -> WalkProgress:
        walk = WalkProgress()

        called: list[bool] = []

        def once() -> None:
            if walk.overall().rounds and not called:
                called.append(True)
                inside(walk)

        walk.listeners.append(once)
        return walk

    settings = WorkerSettings(server=client.base_url, device="cpu", lease_s=LEASE_S, heads_cache=tmp / "heads")
    return JobWorker(client, settings, progress=progress)


def test_a_running_jobs_state_shows_its_walks_progress(served: tuple[CacheClient, Path]) -> None:
    client, tmp = served
    jobs = JobsClient(client)
    job = jobs.submit("step_0.pt")
    seen: list[JobState] = []

    def look(_: WalkProgress) -> None:  # mid-walk: the state the server shows once the worker has reported
        seen.append(_until(lambda: s if (s := jobs.job(job.job_id)).progress else None, "no progress reported"))

    assert _worker(client, tmp, look).run_one()
    [running] = seen
    assert running.status == JobStatus.running and running.progress is not None
    assert (running.progress.prompts_total, running.progress.prompts_walked) == (PROMPTS, 0)
    assert running.progress.rounds >= 1 and running.progress.reported_at is not None
    done = jobs.job(job.job_id)
    assert done.status == JobStatus.done and done.progress is not None  # the final count beside the outcome
    assert (done.progress.prompts_walked, done.progress.eta_s) == (PROMPTS, 0)
    assert done.progress.rounds == jobs.report(job.job_id).summary.cost.drafted_blocks  # type: ignore[union-attr]


def test_cancelling_a_running_job_stops_its_worker_and_ends_it_cancelled(
    served: tuple[CacheClient, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    client, tmp = served
    jobs = JobsClient(client)
    job = jobs.submit("step_0.pt")
    rounds: list[int] = []

    def cancel(walk: WalkProgress) -> None:  # mid-walk: cancel, and go on only once the worker has heard
        assert main(["cancel", job.job_id, "--server", client.base_url]) == ExitCode.ok  # DELETE /jobs/{id}
        assert f"job {job.job_id}: cancelling" in capsys.readouterr().out
        assert jobs.job(job.job_id).status == JobStatus.cancelling
        _until(lambda: job if walk.stopping(0) else None, "the worker never heard of the cancel")
        rounds.append(walk.of(0).rounds)

    assert _worker(client, tmp, cancel).run_one()
    final = jobs.job(job.job_id)
    assert final.status == JobStatus.cancelled and "stopped its walk after 0 of 3 prompts" in (final.error or "")
    assert final.progress is not None and final.progress.prompts_walked == 0
    assert final.progress.rounds > rounds[0]  # one more drafter forward, then it stopped
    assert jobs.claim("w", 60) is None  # never run again
    assert main(["cancel", job.job_id, "--server", client.base_url]) == ExitCode.ok
    assert "removed" in capsys.readouterr().out  # a cancelled job is removed like a finished one


def test_the_eta_is_the_rate_so_far_and_unknown_before_a_prompt_is_walked() -> None:
    now = [100.0]
    walk = WalkProgress(clock=lambda: now[0])
    walk.start([4, 2])
    walk.drafted(0, 5)
    now[0] = 110.0
    assert (walk.of(0).rounds, walk.of(0).eta_s) == (5, None)
    walk.walked(0, 1)
    assert walk.of(0).eta_s == 30.0 and walk.of(0).line() == "walked 1/4 prompts, 5 rounds, 10 s, ETA 30 s"
    walk.walked(1, 2)
    assert (walk.overall().prompts_walked, walk.overall().prompts_total, walk.of(1).eta_s) == (3, 6, 0.0)
