"""`eval-worker watch --tensorboard DIR`: each finished checkpoint's taus (whole run and per set) land in
DIR as TensorBoard scalars at its training step, each job once, as TensorBoard itself reads them back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoConfig

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.jobs import JobStatus
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import tiny_drafter_config

pytestmark = pytest.mark.slow


def test_finished_checkpoints_become_scalars_at_their_step(tiny_target: Path, tmp_path: Path) -> None:
    root, board = tmp_path / "runs", tmp_path / "tb"
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5]), 3)
    for step in (10, 20):
        save_torch_checkpoint(root / "v1" / f"step_{step}.pt", drafter, global_step=step, epoch=0)
    server = running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root))
    with server as url, CacheClient(url) as client:
        specs = [{"token_ids": [5, 6, 7], "sets": ["a"]}, {"token_ids": [9, 8, 7, 6], "sets": ["b"]}]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=12)])
        stop = threading.Event()
        settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
        worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
        worker.start()
        try:
            argv = [
                "watch",
                str(root / "v1"),
                "--server",
                url,
                "--checkpoint-root",
                str(root),
                "--once",
                "--interval",
                "0.2",
                "--tree-budget",
                "4",
                "--set",
                "a",
                "--set",
                "b",
                "--tensorboard",
                str(board),
            ]
            assert main(argv) == 0
            assert main(argv) == 0  # again: nothing new to submit, nothing written twice
        finally:
            stop.set()
            worker.join()
        jobs = JobsClient(client)
        done = jobs.jobs(JobStatus.done)
        reports = {r.step: r for r in (jobs.report(j.job_id) for j in done)}
    assert len(done) == 2 and sorted(reports) == [10, 20]
    events = EventAccumulator(str(board))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"tau/chain", "tau/ddtree-4", "tau/a/chain", "tau/b/ddtree-4"} <= tags
    for tag, pick in (
        ("tau/chain", lambda r: r.summary.chain),
        ("tau/ddtree-4", lambda r: r.summary.trees[4]),
        ("tau/b/chain", lambda r: r.summary.by_set["b"].chain),
    ):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [10, 20]  # each job once, at its training step
        for s in scalars:
            assert s.value == pytest.approx(pick(reports[s.step]).mean_tau, rel=1e-6)
