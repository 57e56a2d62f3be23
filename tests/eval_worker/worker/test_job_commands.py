"""`eval-worker submit --wait`, `watch` and `compare` against a real server, with a worker running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.jobs import JobStatus
from testing.checkpoints import save_hf_checkpoint, save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import tiny_drafter_config

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tiny_target: Path, tmp_path: Path) -> Iterator[tuple[str, Path, DFlashDrafter]]:
    """A server taking jobs under `root`, registered prompts, and a worker thread claiming jobs."""
    root = tmp_path / "runs"
    root.mkdir()
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5]), 3)
    with running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            ids = [p.prompt_id for p in client.register([{"token_ids": [5, 6, 7]}], max_new_tokens=12)]
            client.wait_ready(ids)
        stop = threading.Event()
        settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
        with CacheClient(url) as client:
            worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
            worker.start()
            try:
                yield url, root, drafter
            finally:
                stop.set()
                worker.join()


def test_submit_wait_watch_and_compare(
    served: tuple[str, Path, DFlashDrafter], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, root, drafter = served
    first = save_torch_checkpoint(root / "v1" / "step_10.pt", drafter, global_step=10, epoch=0)
    argv = ["submit", str(first), "--server", url, "--checkpoint-root", str(root), "--tree-budget", "4", "--wait"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "v1/step_10.pt" in out and "ddtree-4" in out and "[1, 3, 5] (decoder outputs; checkpoint)" in out

    save_torch_checkpoint(root / "v1" / "step_20.pt", drafter, global_step=20, epoch=0)
    save_hf_checkpoint(root / "v1" / "hf_30", drafter)
    (root / "v1" / "notes.txt").write_text("not a checkpoint")
    watch = ["watch", str(root / "v1"), "--server", url, "--checkpoint-root", str(root), "--once", "--interval", "0.2"]
    assert main(watch) == 0
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        submitted = sorted(j.checkpoint_relative for j in jobs.jobs())
        assert submitted == ["v1/hf_30", "v1/step_10.pt", "v1/step_20.pt"]  # step_10 not submitted twice
        for job in jobs.jobs():
            assert jobs.wait(job.job_id, timeout_s=60, poll_s=0.1).status == JobStatus.done

    capsys.readouterr()
    assert main(["compare", "--server", url, "--plot", str(tmp_path / "tau.png")]) == 0
    table = capsys.readouterr().out.splitlines()
    # by run, then step: the HF dir has no step; step_10 was submitted with a DDTree, a run of its own
    assert [line.split()[:2] for line in table[2:5]] == [["-", "hf_30:"], ["20", "v1:"], ["10", "v1:"]]
    assert ", ddtree 4" in table[4] and "ddtree" not in table[3]
    assert (tmp_path / "tau.png").read_bytes()[:4] == b"\x89PNG"


def test_submit_outside_the_root_is_refused_with_a_message(
    served: tuple[str, Path, DFlashDrafter], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, root, drafter = served
    outside = save_torch_checkpoint(tmp_path / "elsewhere" / "step_1.pt", drafter, global_step=1, epoch=0)
    assert main(["submit", str(outside), "--server", url]) == ExitCode.server
    assert "outside the checkpoint root" in capsys.readouterr().err
    assert main(["submit", str(outside), "--server", url, "--checkpoint-root", str(root)]) == ExitCode.usage
    assert "not under --checkpoint-root" in capsys.readouterr().err


def test_the_jobs_page_flow_with_a_token(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/jobs.md as written: a server started with CACHE_SERVER_TOKEN; `eval-worker serve` and `submit`
    given it as EVAL_WORKER_TOKEN (or --token); without it, exit 5 naming both."""
    root = tmp_path / "runs"
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5]), 3)
    checkpoint = save_torch_checkpoint(root / "v4" / "step_20.pt", drafter, global_step=20, epoch=0)
    extra = ("--checkpoint-root", str(root), "--job-max-attempts", "3")
    with running_server(tiny_target, tmp_path / "store", *extra, env={"CACHE_SERVER_TOKEN": "s3cret"}) as url:
        with CacheClient(url, token="s3cret") as client:
            client.wait_ready([p.prompt_id for p in client.register([{"token_ids": [5, 6, 7]}], max_new_tokens=12)])
        monkeypatch.delenv("EVAL_WORKER_TOKEN", raising=False)
        assert main(["submit", str(checkpoint), "--server", url]) == ExitCode.server
        err = capsys.readouterr().err
        assert err.startswith("eval-worker: 401 unauthorized: ") and err.count("\n") == 1
        assert err.endswith(
            "give eval-worker the server's token (its CACHE_SERVER_TOKEN) as EVAL_WORKER_TOKEN or --token\n"
        )
        serve = [sys.executable, "-m", "eval_worker.cli", "serve", "--server", url, "--poll-interval", "0.2"]
        env = {"EVAL_WORKER_TOKEN": "s3cret", "EVAL_WORKER_DEVICE": "cpu", "EVAL_WORKER_HEADS_CACHE": str(tmp_path)}
        with (tmp_path / "worker.log").open("ab") as log:
            worker = subprocess.Popen(serve, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        try:
            monkeypatch.setenv("EVAL_WORKER_TOKEN", "s3cret")
            assert main(["submit", str(checkpoint), "--server", url, "--tree-budget", "4", "--wait"]) == 0
            assert "v4/step_20.pt" in capsys.readouterr().out
            monkeypatch.delenv("EVAL_WORKER_TOKEN")
            assert main(["submit", str(checkpoint), "--server", url, "--token", "s3cret"]) == 0  # queued: a write
        finally:
            worker.send_signal(signal.SIGTERM)  # finishes the job in hand, then exits 0
            assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-3000:]
