"""`eval-worker evaluate` / `inspect` against a real `cache-server serve` process on loopback."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cache_server.client import CacheClient
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.cli import main
from eval_worker.evaluation.evaluate import evaluate
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.eval_spec import DFlashOptions
from schemas.model import ModelInfo
from schemas.report import EvalReport
from testing.checkpoints import save_hf_checkpoint, save_torch_checkpoint
from testing.servers import HIDDEN_REQUESTS, free_port, running_server, server_metric
from testing.tiny_trainer import Sequences
from tests.eval_worker.evaluation.test_evaluate import TinySource

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server") / "store"


@pytest.fixture(scope="module")
def server(tiny_target: Path, store: Path, sequences: Sequences) -> Iterator[tuple[str, list[str]]]:
    """A real server holding the test prompts with the target's greedy responses."""
    with running_server(tiny_target, store) as url, CacheClient(url) as client:
        specs = sequences.prompt_specs()
        ids = [p.prompt_id for p in client.register(specs)]
        client.wait_ready(ids, timeout_s=60)
        yield url, ids


def test_evaluate_against_a_real_server_matches_in_process_ground_truth(
    server: tuple[str, list[str]],
    trained_drafter: DFlashDrafter,
    target: Any,
    target_info: ModelInfo,
    sequences: Sequences,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, ids = server
    ckpt = save_torch_checkpoint(tmp_path / "step_120.pt", trained_drafter, global_step=120, epoch=1)
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    out = tmp_path / "report.json"
    argv = ["evaluate", str(ckpt), "--server", url, "--all-prompts", "--tree-budget", "3", "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    report = EvalReport.model_validate_json(out.read_text())
    printed = capsys.readouterr().out
    assert "chain" in printed and "ddtree-3" in printed and "[1, 3, 5] (decoder outputs; checkpoint)" in printed

    truth = evaluate(
        TinySource(target, target_info, sequences),
        load_checkpoint(ckpt, target_info, LoadRequest(options=DFlashOptions(tree_budgets=[3]))),
        [f"p{i}" for i in range(len(ids))],
        heads_cache=HeadsCache(tmp_path / "truth-heads"),
        options=EvalOptions(progress=False),
    )
    served = {p.prompt_id: p for p in report.prompts}
    assert sorted(served) == sorted(ids)
    for pid, expected in zip(ids, truth.prompts, strict=True):
        assert served[pid].chain == expected.chain
        assert served[pid].trees == expected.trees
    assert report.summary.chain.mean_tau == pytest.approx(truth.summary.chain.mean_tau)
    # the responses are the target's greedy continuations, and the cache confirmed it per prompt
    assert [p.greedy_mismatches for p in report.prompts] == [0] * len(ids)
    assert report.summary.prompts_not_target_greedy == 0
    assert (report.step, report.layer_ids_source, report.target_layer_ids) == (120, "checkpoint", [1, 3, 5])
    assert (tmp_path / "heads").is_dir()  # heads cached by fingerprint for the next checkpoint


def test_feature_requests_spread_over_several_servers_with_the_same_result(
    server: tuple[str, list[str]],
    tiny_target: Path,
    store: Path,
    trained_drafter: DFlashDrafter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, ids = server
    ckpt = save_torch_checkpoint(tmp_path / "step_5.pt", trained_drafter, global_step=5, epoch=1)
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    argv = ["evaluate", str(ckpt), "--all-prompts", "--device", "cpu", "--out"]
    assert main([*argv, str(tmp_path / "one.json"), "--server", url]) == 0
    with running_server(tiny_target, store) as second:  # the same store and database
        before = [server_metric(u, HIDDEN_REQUESTS) for u in (url, second)]
        assert main([*argv, str(tmp_path / "two.json"), "--server", f"{url},{second}"]) == 0
        after = [server_metric(u, HIDDEN_REQUESTS) for u in (url, second)]
    one, two = (EvalReport.model_validate_json((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert [p.model_dump() for p in two.prompts] == [p.model_dump() for p in one.prompts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [len(ids) / 2, len(ids) / 2]


def test_inferred_layers_are_reported(
    server: tuple[str, list[str]],
    trained_drafter: DFlashDrafter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, ids = server
    ckpt = save_hf_checkpoint(tmp_path / "hf", trained_drafter)
    config = json.loads((ckpt / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]  # 3 taps of a 6-layer target -> formula [1, 2, 3]
    (ckpt / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    out = tmp_path / "r.json"
    with caplog.at_level(logging.INFO):
        assert main(["evaluate", str(ckpt), "--server", url, "--prompts", ids[0], "--out", str(out)]) == 0
    report = EvalReport.model_validate_json(out.read_text())
    assert (report.target_layer_ids, report.layer_ids_source) == ([1, 2, 3], "inferred")
    assert "[1, 2, 3]" in caplog.text


def test_refused_checkpoint_exits_refused_naming_shapes_and_layers(
    server: tuple[str, list[str]], trained_drafter: DFlashDrafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = server
    ckpt = save_hf_checkpoint(tmp_path / "hf", trained_drafter)
    config = json.loads((ckpt / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 2, 3, 4]  # a 4-layer config for a 3-tap fc
    (ckpt / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", str(ckpt), "--server", url, "--all-prompts"]) == ExitCode.refused
    err = capsys.readouterr().err
    assert "fc.weight" in err and "[1, 2, 3, 4]" in err and "192" in err


def test_unreachable_server_exits_unreachable(trained_drafter: DFlashDrafter, tmp_path: Path) -> None:
    ckpt = save_hf_checkpoint(tmp_path / "hf", trained_drafter)
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert main(["evaluate", str(ckpt), "--server", nowhere, "--all-prompts"]) == ExitCode.unreachable


def test_inspect(
    server: tuple[str, list[str]], trained_drafter: DFlashDrafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = server
    ckpt = save_torch_checkpoint(tmp_path / "c.pt", trained_drafter, global_step=7, epoch=0)
    assert main(["inspect", str(ckpt)]) == 0
    text = capsys.readouterr().out
    assert "torch_dict" in text and "7 / 0" in text and "[1, 3, 5] (from the checkpoint)" in text
    assert "in_features 192, out_features 64 (3 taps x 64)" in text
    assert main(["inspect", str(ckpt), "--server", url]) == 0
    assert "loads strictly" in capsys.readouterr().out


def test_inspect_and_compare_take_the_server_from_the_environment(
    server: tuple[str, list[str]],
    trained_drafter: DFlashDrafter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = server
    ckpt = save_torch_checkpoint(tmp_path / "c.pt", trained_drafter, global_step=7, epoch=0)
    monkeypatch.setenv("EVAL_WORKER_SERVER", url)
    assert main(["inspect", str(ckpt)]) == 0
    assert "loads strictly" in capsys.readouterr().out
    monkeypatch.setenv("EVAL_WORKER_SERVER", f"http://127.0.0.1:{free_port()}")  # nobody there
    assert main(["compare"]) == ExitCode.unreachable  # it was asked, so it is reached for: unreachable, not ignored


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_device_cuda_without_a_gpu_is_a_clear_usage_error(
    server: tuple[str, list[str]], trained_drafter: DFlashDrafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = server
    ckpt = save_hf_checkpoint(tmp_path / "hf", trained_drafter)
    assert main(["evaluate", str(ckpt), "--server", url, "--prompts", ids[0], "--device", "cuda"]) == ExitCode.usage
    assert main(["serve", "--server", url, "--device", "cuda"]) == ExitCode.usage
    assert capsys.readouterr().err.count("no CUDA device") == 2


def test_a_sweep_fetches_each_prompt_once_and_writes_a_report_per_checkpoint(
    server: tuple[str, list[str]],
    trained_drafter: DFlashDrafter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, ids = server
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    runs = tmp_path / "runs"
    paths = [save_torch_checkpoint(runs / f"step_{s}.pt", trained_drafter, global_step=s, epoch=0) for s in (1, 2)]
    paths.append(save_hf_checkpoint(runs / "final", trained_drafter))  # same layers, another layout
    single = tmp_path / "single.json"
    common = ["--server", url, "--all-prompts", "--tree-budget", "3", "--device", "cpu"]
    assert main(["evaluate", str(paths[0]), *common, "--out", str(single)]) == 0

    before = server_metric(url, HIDDEN_REQUESTS)
    assert main(["evaluate", *map(str, paths), *common, "--out-dir", str(tmp_path / "reports")]) == 0
    assert server_metric(url, HIDDEN_REQUESTS) - before == len(
        ids
    )  # one GET /hidden per prompt for all three checkpoints

    reports = [
        EvalReport.model_validate_json((tmp_path / "reports" / n).read_text())
        for n in ("step_1.json", "step_2.json", "final.json")
    ]
    alone = EvalReport.model_validate_json(single.read_text())
    for report in reports:
        assert [p.chain for p in report.prompts] == [p.chain for p in alone.prompts]
        assert [p.trees for p in report.prompts] == [p.trees for p in alone.prompts]
    costs = [r.summary.cost for r in reports]
    assert all(c is not None for c in costs)
    assert costs[0].feature_bytes_fetched > 0 and costs[0].feature_cache_hits == 0  # type: ignore[union-attr]
    assert [(c.feature_bytes_fetched, c.feature_cache_hits) for c in costs[1:]] == [(0, len(ids))] * 2  # type: ignore[union-attr]


def test_out_takes_one_checkpoint(
    server: tuple[str, list[str]], trained_drafter: DFlashDrafter, tmp_path: Path
) -> None:
    url, _ = server
    paths = [str(save_torch_checkpoint(tmp_path / f"{s}.pt", trained_drafter, global_step=s, epoch=0)) for s in (1, 2)]
    argv = ["evaluate", *paths, "--server", url, "--all-prompts", "--out", str(tmp_path / "r.json")]
    assert main(argv) == ExitCode.usage


def test_inspect_shows_the_inferred_ids_when_the_config_says_the_target_depth(
    trained_drafter: DFlashDrafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = save_hf_checkpoint(tmp_path / "hf", trained_drafter)
    config = json.loads((ckpt / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]
    config["num_target_layers"] = 12
    (ckpt / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(ckpt)]) == 0
    assert "[1, 5, 9] (inferred with the DFlash formula: 3 taps of 12 layers)" in capsys.readouterr().out


def test_doctor_names_the_reading_a_shifted_checkpoint_was_trained_on(
    server: tuple[str, list[str]], trained_drafter: DFlashDrafter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = server
    right = save_hf_checkpoint(tmp_path / "right", trained_drafter)  # trained on [1, 3, 5]
    shifted = DFlashDrafter(dataclasses.replace(trained_drafter.cfg, target_layer_ids=(0, 2, 4)), 3)
    shifted.load_state_dict(trained_drafter.state_dict())
    wrong = save_hf_checkpoint(tmp_path / "wrong", shifted)  # the same weights, its ids written one below
    assert main(["doctor", str(wrong), "--server", url, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reading [1, 3, 5] (one layer later) scores" in out and "offset convention" in out
    assert main(["doctor", str(right), "--server", url, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "the declared layers score best" in out
