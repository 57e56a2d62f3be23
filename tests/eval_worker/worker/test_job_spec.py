"""A job carries the whole spec: every option of `eval-worker evaluate` goes through `submit`, `POST /jobs`
and the worker, and the job's report is the local one; options of another family are refused naming
both; a job queued before the spec column existed is read back and runs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, FamilyOptions
from schemas.jobs import JobState, JobStatus
from schemas.report import DFlashDrafting, Drafting, Eagle3Drafting, EvalReport
from testing.checkpoints import save_torch_checkpoint
from testing.eagle3 import eagle3_config, eagle3_files, random_eagle3
from testing.servers import running_server
from testing.tiny_trainer import Sequences, tiny_drafter_config
from tests.cache_server.jobs_helpers import write_v6_database

pytestmark = pytest.mark.slow
IN_SET = 5  # the first prompts are set "a"


@dataclasses.dataclass(frozen=True)
class Case:
    """A torch.save checkpoint of one family, its config beside it (with a key only --inert-config-keys
    accepts), the flags that use every option its family has, and what the job and report must say."""

    checkpoint: Path
    config: Path
    flags: list[str]
    options: FamilyOptions
    drafting: Drafting
    spec: dict[str, Any]  # the spec's fields besides the config and the family block


def _dflash(root: Path, target: Any) -> Case:
    """Layer ids and mask token given, not written; a block length and a DDTree budget; probabilistic."""
    cfg = dataclasses.replace(tiny_drafter_config(target, [1, 3, 5], block_size=4), target_layer_ids=None)
    torch.manual_seed(0)
    path = save_torch_checkpoint(
        root / "dflash" / "step_3.pt", DFlashDrafter(cfg, 3), global_step=3, epoch=0, include_config=False
    )
    config = {k: v for k, v in cfg.to_hf_dict("top_level").items() if k != "mask_token_id"} | {"wandb_id": "run"}
    mask = str(cfg.mask_token_id)
    flags = ["--target-layer-ids", "1,3,5", "--tree-budget", "3", "--block-size", "3", "--mask-token-id", mask]
    flags += ["--draft-sampling", "probabilistic"]
    options = DFlashOptions(tree_budgets=[3], block_size=3, mask_token_id=cfg.mask_token_id)
    drafting = DFlashDrafting(block_size=3, mask_token_id=cfg.mask_token_id, tree_budgets=[3])
    spec = {"target_layer_ids": [1, 3, 5], "draft_sampling": "probabilistic"}
    return Case(path, _config(path, config), flags, options, drafting, spec)


def _eagle3(root: Path, target: Any) -> Case:
    """Ids written as decoder outputs [2, 4, 5], read as layer inputs; chain steps and an EAGLE tree."""
    config, state = eagle3_files(random_eagle3(eagle3_config(target), 3, seed=3), "specforge", layer_ids=[2, 4, 5])
    path = root / "eagle3" / "step_4.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model_state_dict": state, "global_step": 4, "epoch": 0}, path)
    flags = ["--family", "eagle3", "--steps", "2", "--eagle-tree", "3,2,8", "--layer-convention", "layer_input"]
    options = Eagle3Options(steps=2, eagle_trees=["3,2,8"], layer_convention="layer_input")
    drafting = Eagle3Drafting(steps=2, draft_vocab_size=target.vocab_size, eagle_trees=["3,2,8"])
    return Case(path, _config(path, config | {"wandb_id": "run"}), flags, options, drafting, {})


def _config(checkpoint: Path, config: dict[str, Any]) -> Path:
    path = checkpoint.with_suffix(".json")
    path.write_text(json.dumps(config))
    return path


CASES: dict[str, Callable[[Path, Any], Case]] = {"dflash": _dflash, "eagle3": _eagle3}


@pytest.fixture(scope="module")
def served(
    tiny_target: Path, sequences: Sequences, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A server taking jobs under its root, its prompts ready, the first of them in set "a"."""
    root = tmp_path_factory.mktemp("runs")
    specs = [s | {"sets": ["a"]} if i < IN_SET else s for i, s in enumerate(sequences.prompt_specs())]
    with running_server(tiny_target, tmp_path_factory.mktemp("store"), "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            client.wait_ready([p.prompt_id for p in client.register(specs)])
        yield url, root


def _run_job(url: str, checkpoint: Path, tmp_path: Path) -> tuple[JobState, JobState, EvalReport | None]:
    """The checkpoint's job as submitted, and as it ended after one worker pass (with its report if done)."""
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        [job] = [j for j in jobs.jobs() if j.checkpoint == str(checkpoint.resolve())]
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        final = jobs.job(job.job_id)
        return job, final, jobs.report(job.job_id) if final.status == JobStatus.done else None


def _comparable(report: EvalReport) -> dict[str, Any]:
    """The report without what legitimately differs between two runs: where the checkpoint was named
    from, and the time it took."""
    out = report.model_dump(mode="json", exclude={"checkpoint_path"})
    del out["summary"]["wall_time_s"], out["summary"]["cost"]["seconds"]
    out["prompts"] = sorted(out["prompts"], key=lambda p: p["prompt_id"])
    return out


@pytest.mark.parametrize("family", list(CASES))
def test_every_option_of_evaluate_goes_through_a_job_to_the_same_report(
    family: str, served: tuple[str, Path], tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = served
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    case = CASES[family](root, AutoConfig.from_pretrained(tiny_target))
    flags = ["--set", "a", "--config", str(case.config), "--inert-config-keys", "wandb_id", *case.flags]
    local = tmp_path / "local.json"
    assert (
        main(["evaluate", str(case.checkpoint), "--server", url, "--device", "cpu", *flags, "--out", str(local)]) == 0
    )
    assert main(["submit", str(case.checkpoint), "--server", url, "--checkpoint-root", str(root), *flags]) == 0

    job, final, report = _run_job(url, case.checkpoint, tmp_path)
    assert job.spec == EvalSpec(
        sets=["a"],
        config=str(case.config.resolve()),  # resolved under the root, as the checkpoint is
        inert_config_keys=["wandb_id"],
        family_options=case.options,
        **case.spec,
    )
    assert final.status == JobStatus.done and report is not None, final.error
    assert (report.drafting, report.inert_config_keys) == (case.drafting, ["wandb_id"])
    assert report.summary.prompts_evaluated == IN_SET and list(report.summary.by_set) == ["a"]
    assert _comparable(report) == _comparable(EvalReport.model_validate_json(local.read_text()))


def test_options_of_another_family_are_refused_naming_both(
    served: tuple[str, Path], tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, root = served
    case = _dflash(root / "other", AutoConfig.from_pretrained(tiny_target))
    flags = ["--all-prompts", "--config", str(case.config), "--inert-config-keys", "wandb_id"]
    eagle = ["--family", "eagle3", "--steps", "2"]
    named = "is a drafter of the DFlash family: the options given (steps) are the EAGLE-3 family's"
    assert main(["evaluate", str(case.checkpoint), "--server", url, *flags, *eagle]) == ExitCode.refused
    assert named in capsys.readouterr().err
    submit = ["submit", str(case.checkpoint), "--server", url, "--checkpoint-root", str(root)]
    assert main([*submit, "--config", str(case.config), *eagle]) == 0
    _, final, _ = _run_job(url, case.checkpoint, tmp_path)
    assert (final.status, final.attempts) == (JobStatus.failed, 1) and named in (final.error or "")


def test_a_job_queued_before_the_spec_column_is_read_back_and_runs(
    tiny_target: Path, sequences: Sequences, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(AutoConfig.from_pretrained(tiny_target), [1, 3, 5]), 3)
    checkpoint = save_torch_checkpoint(root / "step_1.pt", drafter, global_step=1, epoch=0).resolve()
    db = tmp_path / "coordination.sqlite"
    write_v6_database(
        str(db),
        [
            {
                "job_id": "old",
                "checkpoint": str(checkpoint),
                "checkpoint_relative": "step_1.pt",
                "tree_budgets": "[3]",
                "block_size": 3,
            }
        ],
    )
    serve = ("--checkpoint-root", str(root), "--db", str(db))
    with running_server(tiny_target, tmp_path / "store", *serve) as url, CacheClient(url) as client:
        client.wait_ready([p.prompt_id for p in client.register(sequences.prompt_specs()[:3])])
        jobs = JobsClient(client)
        assert jobs.job("old").spec == EvalSpec(family_options=DFlashOptions(tree_budgets=[3], block_size=3))
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        assert jobs.job("old").status == JobStatus.done
        report = jobs.report("old")
    assert report.drafting == DFlashDrafting(block_size=3, mask_token_id=drafter.cfg.mask_token_id, tree_budgets=[3])
    assert report.summary.prompts_evaluated == 3 and set(report.summary.trees) == {3}
