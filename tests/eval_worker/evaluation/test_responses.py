"""Finished chats (training data, no response) through the real server: evaluating only them, or a set of
only them, is refused before any fetch with what to register instead, by `evaluate` and by a job alike; a
run where some prompts have no response reports how many, in its warnings and its table."""

from __future__ import annotations

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
from schemas.eval_spec import EvalSpec
from schemas.jobs import JobStatus
from schemas.report import EvalReport
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import tiny_drafter_config

pytestmark = pytest.mark.slow
CHATS = [
    [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}],
    [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a + b"}],
]


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Two finished chats in set "chats", two prompts with given responses in set "answered", one of each
    in set "mixed"."""
    root = tmp_path_factory.mktemp("runs")
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5], block_size=4), 3)
    save_torch_checkpoint(root / "step_5.pt", drafter, global_step=5, epoch=0)
    chats = [{"messages": m, "sets": ["chats", "mixed"][: 2 - i]} for i, m in enumerate(CHATS)]
    answered = [
        {"token_ids": [5 + i, 6, 7], "response_token_ids": [8, 9, 10, 11, 12], "sets": ["answered", "mixed"][: 2 - i]}
        for i in range(2)
    ]
    with running_server(tiny_target, tmp_path_factory.mktemp("store"), "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            client.wait_ready([p.prompt_id for p in client.register([*chats, *answered])])
        yield url, root


def test_only_finished_chats_are_refused_by_evaluate_and_by_a_job_naming_what_to_register(
    served: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, root = served
    base = ["evaluate", str(root / "step_5.pt"), "--server", url, "--device", "cpu"]
    for sets, wanted in (
        (["--set", "chats"], "none of the 2 prompts has a response to walk"),
        (["--set", "chats", "--set", "answered"], "set 'chats': none of its 2 prompts has a response to walk"),
    ):
        assert main([*base, *sets]) == ExitCode.usage
        err = capsys.readouterr().err
        assert wanted in err and "without --whole-chats" in err
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        job = jobs.submit("step_5.pt", spec=EvalSpec(sets=["chats"]))
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        final = jobs.job(job.job_id)
        assert (final.status, final.attempts) == (JobStatus.failed, 1)  # final: a retry finds the same prompts
        assert final.error is not None and "none of the 2 prompts has a response to walk" in final.error


def test_a_run_with_some_finished_chats_counts_them_in_its_warnings_and_table_as_a_job_does(
    served: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = served
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    base = ["evaluate", str(root / "step_5.pt"), "--server", url, "--device", "cpu"]
    assert main([*base, "--all-prompts"]) == 0  # the finished chats among them
    table = capsys.readouterr().out
    assert "warning     2 prompts evaluated, 2 without rounds (no response to walk" in table
    assert "without --whole-chats" in table
    out = tmp_path / "report.json"
    assert main([*base, "--set", "mixed", "--set", "answered", "--out", str(out)]) == 0
    local = EvalReport.model_validate_json(out.read_text())
    assert local.summary.chain.prompts_without_rounds == 1 and local.summary.chain.mean_tau is not None
    assert local.warnings[0].startswith("2 prompts evaluated, 1 without rounds")
    assert local.warnings[1:] == ["set 'mixed': 1 prompts evaluated, 1 without rounds"]  # "answered" has all
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        job = jobs.submit("step_5.pt", spec=EvalSpec(sets=["mixed", "answered"]))
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        assert jobs.report(job.job_id).warnings == local.warnings
