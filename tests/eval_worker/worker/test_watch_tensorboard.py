"""`eval-worker watch --once --tensorboard DIR`: each finished checkpoint's taus (whole run and per set) land
in DIR as TensorBoard scalars at its training step, each job once and each training run in a run of its own,
as TensorBoard itself reads them back; a job that fails is printed and makes the exit status 6."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoConfig

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.jobs import JobStatus
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import tiny_drafter_config

pytestmark = pytest.mark.slow


def _drafter(target: Path, block_size: int) -> DFlashDrafter:
    torch.manual_seed(block_size)
    return DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(target), [1, 3, 5], block_size=block_size), 3)


def test_finished_checkpoints_become_scalars_at_their_step_one_run_each_and_failures_are_printed(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, board = tmp_path / "runs", tmp_path / "tb"
    for run, block_size in (("v1", 3), ("v2", 4)):  # two training runs, their checkpoints at the same steps
        for step in (10, 20):
            save_torch_checkpoint(
                root / run / f"step_{step}.pt", _drafter(tiny_target, block_size), global_step=step, epoch=0
            )
    refused = torch.load(root / "v1" / "step_10.pt", weights_only=True)
    refused["config"]["dflash_config"]["target_layer_ids"] = [1, 2, 3, 4]  # 4 layers for a 3-tap fc
    (root / "bad").mkdir()
    torch.save(refused, root / "bad" / "step_10.pt")
    server = running_server(tiny_target, tmp_path / "store", "--checkpoint-root", str(root))
    with server as url, CacheClient(url) as client:
        specs = [{"token_ids": [5, 6, 7], "sets": ["a"]}, {"token_ids": [9, 8, 7, 6], "sets": ["b"]}]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=12)])
        stop = threading.Event()
        settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
        worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
        worker.start()
        try:
            argv = ["watch", str(root), "--server", url, "--checkpoint-root", str(root), "--once"]
            argv += ["--interval", "0.2", "--tree-budget", "4", "--set", "a", "--set", "b", "--tensorboard", str(board)]
            assert main(argv) == ExitCode.job_failed
            err = capsys.readouterr().err
            [failed] = JobsClient(client).jobs(JobStatus.failed)
            assert f"job {failed.job_id} failed after 1 attempts (bad/step_10.pt): checkpoint refused" in err
            assert "1 of the 5 jobs submitted failed" in err
            assert main(argv) == 0  # again: nothing new to submit, nothing written twice
        finally:
            stop.set()
            worker.join()
        jobs = JobsClient(client)
        done = jobs.jobs(JobStatus.done)
        reports = {(Path(j.checkpoint_relative).parent.name, r.step): r for j in done for r in [jobs.report(j.job_id)]}
    assert len(done) == 4 and sorted(reports) == [("v1", 10), ("v1", 20), ("v2", 10), ("v2", 20)]
    combined = EventAccumulator(str(board))
    combined.Reload()
    assert combined.Tags()["scalars"] == []  # no run mixes the training runs
    for run, block_size in (("v1", 3), ("v2", 4)):
        events = EventAccumulator(str(board / run / f"dflash-block{block_size}"))
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
                assert s.value == pytest.approx(pick(reports[run, s.step]).mean_tau, rel=1e-6)
