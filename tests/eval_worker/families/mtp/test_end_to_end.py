"""An MTP head evaluated against a real cache server on its own target (a tiny DeepSeek-V3 whose head sits
in its checkpoint): `eval-worker evaluate TARGET_DIR` gives the rounds of the independent live loop
(`testing/mtp_reference.py`) on every prompt, and an MTP-only checkpoint's job gives its local report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

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


def _mtp_only(target: Path, out: Path) -> Path:
    """The head alone under its published names, beside the target's config with a trainer's own key."""
    out.mkdir()
    config = json.loads((target / "config.json").read_text()) | {"wandb_id": "run-7"}
    (out / "config.json").write_text(json.dumps(config))
    head = {k: v for k, v in load_file(target / "model.safetensors").items() if k.startswith("model.layers.2.")}
    save_file(head, out / "model.safetensors")
    return out


def _comparable(report: EvalReport) -> dict[str, Any]:
    out = report.model_dump(mode="json", exclude={"checkpoint_path"})
    del out["summary"]["wall_time_s"], out["summary"]["cost"]["seconds"]
    out["prompts"] = sorted(out["prompts"], key=lambda p: p["prompt_id"])
    return out


def test_evaluate_gives_the_live_loops_rounds(served: tuple[str, Path], tmp_path: Path) -> None:
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
        for prompt in report.prompts:
            tokens = client.hidden(prompt.prompt_id, [1]).token_ids.tolist()
            run = live[tuple(tokens[: prompt.prompt_len])]
            assert tokens[prompt.prompt_len :] == run.tokens  # the cached response is the target's greedy one
            assert prompt.chain.round_taus == run.round_taus()
    assert len(report.prompts) == len(PROMPTS)
    assert sum(a for run in live.values() for a in run.accepted) > 0


def test_a_job_gives_the_local_report(
    served: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every MTP option through `submit`, `POST /jobs` and the worker, from an MTP-only checkpoint."""
    url, target = served
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    checkpoint = _mtp_only(target, target.parent / "mtp-only")
    flags = ["--all-prompts", "--family", "mtp", "--steps", str(STEPS), "--inert-config-keys", "wandb_id"]
    local = tmp_path / "local.json"
    assert main(["evaluate", str(checkpoint), "--server", url, "--device", "cpu", *flags, "--out", str(local)]) == 0
    submit = ["submit", str(checkpoint), "--server", url, "--checkpoint-root", str(target.parent)]
    assert main([*submit, *flags[1:]]) == 0
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        [job] = [j for j in jobs.jobs() if j.checkpoint_relative == "mtp-only"]
        assert job.spec == EvalSpec(inert_config_keys=["wandb_id"], family_options=MtpOptions(steps=STEPS))
        worker = JobWorker(client, WorkerSettings(server=url, device="cpu", heads_cache=tmp_path / "heads"))
        assert worker.run_one()
        final = jobs.job(job.job_id)
        assert final.status == JobStatus.done, final.error
        from_job = jobs.report(job.job_id)
    assert from_job.inert_config_keys == ["wandb_id"]
    assert _comparable(from_job) == _comparable(EvalReport.model_validate_json(local.read_text()))
