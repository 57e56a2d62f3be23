"""EAGLE-3 through the real server: `evaluate`, `inspect`, jobs and `compare`, for the same drafter saved in
every layout - the same served layers, the same round taus, and equal to the offline walk in process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cache_server.client import CacheClient, JobsClient
from eval_worker.cli import main
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.exit_codes import ExitCode
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.walks import CHAIN, walk_eagle_prompts
from eval_worker.settings import WorkerSettings
from eval_worker.worker.job_worker import JobWorker
from schemas.eval_spec import Eagle3Options, EvalSpec
from schemas.jobs import JobStatus
from schemas.report import Eagle3Drafting, EvalReport
from schemas.trees import EagleTreeShape
from testing.eagle3 import eagle3_config, frequent_d2t, random_eagle3, save_eagle3, train_eagle3
from testing.live_loop import target_heads
from testing.servers import running_server
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import EAGLE_LAYER_IDS, TRAIN_TEXTS

pytestmark = pytest.mark.slow
WRITTEN = {"eagle": None, "specforge": [1, 5, 8], "speculators": [2, 6, 9]}  # all decoder outputs [1, 5, 8]
TREE = EagleTreeShape(3, 2, 8)


@pytest.fixture(scope="module")
def drafter(eagle_target: Any, eagle_sequences: Sequences) -> Eagle3Drafter:
    n = len(TRAIN_TEXTS)
    d2t = frequent_d2t(eagle_sequences.token_ids[:n], 160, eagle_target.config.vocab_size)
    d = random_eagle3(eagle3_config(eagle_target.config, draft_vocab_size=160), 3, seed=5, d2t=d2t)
    train_eagle3(d, eagle_sequences.token_ids[:n], eagle_sequences.taps[:n], target_heads(eagle_target)[0], 60)
    return d


@pytest.fixture(scope="module")
def served(
    eagle_target_dir: Path, eagle_sequences: Sequences, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A real server holding the prompts with the target's greedy responses, taking jobs under a root."""
    root = tmp_path_factory.mktemp("runs")
    with running_server(eagle_target_dir, tmp_path_factory.mktemp("store"), "--checkpoint-root", str(root)) as url:
        with CacheClient(url) as client:
            specs = eagle_sequences.prompt_specs()
            client.wait_ready([p.prompt_id for p in client.register(specs)])
        yield url, root


def test_every_layout_evaluates_to_the_in_process_walk(
    served: tuple[str, Path],
    drafter: Eagle3Drafter,
    eagle_target: Any,
    eagle_sequences: Sequences,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = served
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    paths = [save_eagle3(tmp_path / layout, drafter, layout, layer_ids=ids) for layout, ids in WRITTEN.items()]
    argv = [
        "evaluate",
        *map(str, paths),
        "--server",
        url,
        "--all-prompts",
        "--steps",
        "3",
        "--eagle-tree",
        TREE.key,
        "--device",
        "cpu",
        "--out-dir",
        str(tmp_path / "reports"),
    ]
    assert main(argv) == 0
    reports = [EvalReport.model_validate_json((tmp_path / "reports" / f"{p.name}.json").read_text()) for p in paths]

    seqs = eagle_sequences
    prompts = [
        PromptFeatures(t, ids.tolist(), n)
        for t, ids, n in zip(seqs.taps, seqs.token_ids, seqs.prompt_lens, strict=True)
    ]
    truth = walk_eagle_prompts(drafter, prompts, target_heads(eagle_target)[0], steps=3, trees=[TREE], cost=DraftCost())
    for report, (layout, written) in zip(reports, WRITTEN.items(), strict=True):
        assert (report.drafter_family, report.layout) == ("eagle3", layout)
        assert report.drafting == Eagle3Drafting(steps=3, draft_vocab_size=160, eagle_trees=[TREE.key])
        assert report.target_layer_ids == list(EAGLE_LAYER_IDS) and report.checkpoint_layer_ids == written
        assert report.layer_ids_source == ("default" if written is None else "checkpoint")
        assert [p.chain.round_taus for p in report.prompts] == [w[CHAIN] for w in truth]
        assert [p.eagle_trees[TREE.key].round_taus for p in report.prompts] == [w[TREE.key] for w in truth]
    printed = capsys.readouterr().out
    assert "EAGLE-3 (speculators layout)" in printed and "written [2, 6, 9] as layer_input" in printed

    assert main(["inspect", str(paths[2]), "--server", url]) == 0
    assert "[2, 6, 9] as layer_input (layer inputs" in capsys.readouterr().out
    # A DDTree budget on an EAGLE-3 checkpoint is refused, not ignored.
    assert main(["evaluate", str(paths[0]), "--server", url, "--all-prompts", "--tree-budget", "4"]) == ExitCode.usage
    # A flag the loader does not know stops the run, refused, naming it.
    config = json.loads((paths[2] / "config.json").read_text()) | {"norm_before_attention": True}
    (paths[2] / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["evaluate", str(paths[2]), "--server", url, "--all-prompts"]) == ExitCode.refused
    assert "['norm_before_attention'] are not known" in capsys.readouterr().err


def test_a_narrower_drafter_with_its_own_embedding(
    served: tuple[str, Path],
    eagle_target: Any,
    eagle_sequences: Sequences,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hidden 32 reading taps of the 64-wide target (`target_hidden_size`), embedding from the checkpoint."""
    url, _ = served
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    narrow = replace(
        eagle3_config(eagle_target.config),
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
    )
    drafter = random_eagle3(narrow, 3, seed=7, has_embed=True)
    assert drafter.cfg.target_hidden_size == 64
    path = save_eagle3(tmp_path / "narrow", drafter, "speculators", layer_ids=[2, 6, 9])
    out = tmp_path / "narrow.json"
    argv = ["evaluate", str(path), "--server", url, "--all-prompts", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    report = EvalReport.model_validate_json(out.read_text())
    seqs = eagle_sequences
    prompts = [
        PromptFeatures(t, ids.tolist(), n)
        for t, ids, n in zip(seqs.taps, seqs.token_ids, seqs.prompt_lens, strict=True)
    ]
    truth = walk_eagle_prompts(drafter, prompts, drafter.embed_tokens.weight, steps=3, trees=[], cost=DraftCost())
    assert isinstance(report.drafting, Eagle3Drafting)
    assert report.drafting.steps == 3  # the speculators config names 3 speculative tokens
    assert [p.chain.round_taus for p in report.prompts] == [w[CHAIN] for w in truth]


def test_jobs_and_compare_show_both_families(
    served: tuple[str, Path], drafter: Eagle3Drafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, root = served
    save_eagle3(root / "eagle3" / "step_40.pt", drafter, "speculators", layer_ids=[2, 6, 9], steps=4, global_step=40)
    bad = save_eagle3(root / "eagle3" / "bad.pt", drafter, "specforge", layer_ids=[1, 5], global_step=1)
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        good_job = jobs.submit("eagle3/step_40.pt", spec=EvalSpec(family_options=Eagle3Options(eagle_trees=[TREE.key])))
        bad_job = jobs.submit(str(bad.relative_to(root)))
        stop = threading.Event()
        settings = WorkerSettings(server=url, device="cpu", poll_interval=0.1, heads_cache=tmp_path / "heads")
        worker = threading.Thread(target=JobWorker(client, settings).serve, args=(stop,))
        worker.start()
        try:
            done = jobs.wait(good_job.job_id, timeout_s=120, poll_s=0.1)
            failed = jobs.wait(bad_job.job_id, timeout_s=120, poll_s=0.1)
        finally:
            stop.set()
            worker.join()
        assert done.status == JobStatus.done and done.eagle_trees == [TREE.key]
        assert failed.status == JobStatus.failed and "fc.weight reads 192 features" in (failed.error or "")
        report = jobs.report(good_job.job_id)
    assert isinstance(report.drafting, Eagle3Drafting)
    assert report.drafting.steps == 4 and report.step == 40  # the checkpoint's own speculative_tokens
    assert main(["compare", "--server", url, "--plot", str(tmp_path / "tau.png")]) == 0
    table = capsys.readouterr().out
    assert f"EAGLE-3 4 steps, tree {TREE.key}" in table  # the run's label
