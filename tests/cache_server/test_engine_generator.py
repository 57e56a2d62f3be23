"""Responses from a real serving engine (vLLM on CPU, its own environment): the cache server asks it
for token ids, checks it serves the target, retries while it is away, and fails only what it refuses.
One engine for the module; it is killed and started again on the same port by the fault test."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from schemas.prompts import GenerateSpec
from testing.engine import VllmServer, vllm_python
from testing.servers import free_port, running_server, serve_command, server_metric
from testing.taps import greedy_continuation
from tests.cache_server.reference import direct_layer_outputs

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TEXTS = [
    "def fib(n):",
    "The quick brown fox",
    "Question: what is the capital of France? Answer:",
    "import numpy as np\nx = np.arange(16)",
    "class Stack:\n    def __init__(self):",
    "Speculative decoding drafts several tokens",
    "for i in range(10):",
    "A drafter reads the hidden states",
]
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def engine_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny target whose heads vLLM's CPU attention takes (head_dim 32)."""
    return build_tiny_model(tmp_path_factory.mktemp("engine-target"), layers=4, hidden=128, head_dim=32, seed=0)


@pytest.fixture(scope="module")
def engine(engine_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if vllm_python() is None:
        pytest.fail("the vLLM environment .venv-vllm is missing: ./dev test (or .ci/run) builds it")
    server = VllmServer(engine_target, free_port(), tmp_path_factory.mktemp("vllm") / "vllm.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def in_process(engine_target: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(engine_target, dtype=torch.float32).eval()


def _served(engine_target: Path, store: Path, engine: VllmServer, *extra: str, concurrency: int = 8):  # type: ignore[no-untyped-def]
    return running_server(
        engine_target, store, "--generator", engine.url, "--generator-concurrency", str(concurrency), *extra
    )


def test_engine_responses_are_the_targets_greedy_tokens_and_states_a_direct_forward(
    engine: VllmServer, engine_target: Path, in_process: torch.nn.Module, tmp_path: Path
) -> None:
    # One sequence per capture forward: unpadded, so bit-identical to a direct forward.
    with _served(engine_target, tmp_path / "store", engine, "--batch-tokens", "1") as url, CacheClient(url) as client:
        info = client.model()
        assert info.generator is not None and info.generator.kind == "engine"
        assert (info.generator.url, info.generator.version) == (engine.url, "0.32.0")
        prompts = [{"text": t, "sets": ["engine-set"]} for t in TEXTS]
        ids = [p.prompt_id for p in client.register(prompts, max_new_tokens=NEW_TOKENS)]
        client.wait_ready(ids, timeout_s=300)
        for pid in ids:
            state = client.prompt(pid)
            tokens = state.token_ids or []
            want = greedy_continuation(in_process, tokens[: state.prompt_len], NEW_TOKENS)
            assert tokens == want  # the engine's tokens, equal to the target's own greedy response
            assert state.greedy_mismatches == 0
            assert state.generator == info.generator
            served = client.hidden(pid, list(range(4)))
            direct = torch.cat(direct_layer_outputs(engine_target, tokens), dim=-1).numpy()
            np.testing.assert_array_equal(served.hidden, direct)  # bit for bit, fp32
            assert served.metadata.generator == info.generator.describe()
        (counts,) = client.sets().sets
        assert (counts.ready, counts.greedy_mismatches, counts.prompts_not_greedy) == (len(ids), 0, 0)
        assert server_metric(url, "cache_server_generator_errors_total") == 0


def test_a_given_response_the_target_would_not_choose_shows_in_the_set(
    engine: VllmServer, engine_target: Path, tmp_path: Path
) -> None:
    with _served(engine_target, tmp_path / "store", engine) as url, CacheClient(url) as client:
        greedy = client.register([{"text": TEXTS[0], "sets": ["mixed"]}], max_new_tokens=8)[0].prompt_id
        given = client.register([{"text": TEXTS[1], "response_token_ids": [5, 5, 5, 5], "sets": ["mixed"]}])
        client.wait_ready([greedy, given[0].prompt_id], timeout_s=120)
        state = client.prompt(given[0].prompt_id)
        assert state.generator is not None and state.generator.kind == "given"
        (counts,) = client.sets().sets
        assert counts.greedy_mismatches == state.greedy_mismatches and counts.greedy_mismatches > 0
        assert counts.prompts_not_greedy == 1


def test_sampled_responses_through_the_engine_reproduce_by_seed_and_stay_in_the_targets_support(
    engine: VllmServer, engine_target: Path, tmp_path: Path
) -> None:
    """The engine gets the setting and each sample's seed: the same seed gives the same response from a
    second server on another store, another seed another response; every token is in the target's top-k."""
    setting = GenerateSpec(max_new_tokens=24, temperature=1.0, top_k=20, seed=11, samples=2)
    responses = []
    for store in ("a", "b"):
        with _served(engine_target, tmp_path / store, engine) as url, CacheClient(url) as client:
            ids = [p.prompt_id for p in client.register([{"text": t} for t in TEXTS[:3]], generate=setting)]
            client.wait_ready(ids, timeout_s=300)
            states = [client.prompt(pid) for pid in ids]
            for state in states:
                assert state.generator == client.model().generator and state.outside_support == 0
                assert state.sampling is not None and state.sampling.setting == "T=1 top_k=20"
            responses.append([s.token_ids for s in states])
    assert responses[0] == responses[1]  # seeds 11 and 12 of each prompt, on two servers
    assert all(responses[0][i] != responses[0][i + 1] for i in (0, 2, 4))  # two seeds, two responses


def test_an_engine_serving_another_model_refuses_the_start(
    engine: VllmServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = build_tiny_model(tmp_path_factory.mktemp("other"), layers=4, hidden=128, head_dim=32, seed=1)
    cmd = serve_command(other, tmp_path / "s", free_port(), "--generator", engine.url)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("cache-server: --generator") and "probe" in message
    assert str(other.name) in message and "engine [" in message and "target [" in message


def test_a_prompt_the_engine_refuses_fails_alone(engine: VllmServer, engine_target: Path, tmp_path: Path) -> None:
    # One request in flight at a time: the refused prompt must give its slot back for the others.
    one_at_a_time = _served(engine_target, tmp_path / "store", engine, concurrency=1)
    with one_at_a_time as url, CacheClient(url) as client:
        too_long = client.register([{"text": TEXTS[3]}], max_new_tokens=600)[0].prompt_id  # engine context 512
        deadline = time.monotonic() + 60
        while (state := client.prompt(too_long)).status == "pending" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.status == "failed"
        assert state.error is not None and "max_model_len" in state.error and "HTTP 400" in state.error
        ok = [p.prompt_id for p in client.register([{"text": t} for t in TEXTS[:3]], max_new_tokens=16)]
        client.wait_ready(ok, timeout_s=120)
        assert client.prompt(too_long).status == "failed"


def test_the_engine_killed_mid_run_loses_nothing(
    engine: VllmServer, engine_target: Path, in_process: torch.nn.Module, tmp_path: Path
) -> None:
    with _served(engine_target, tmp_path / "store", engine) as url, CacheClient(url) as client:
        engine.kill()  # away before any generation: every request meets a dead engine
        texts = [f"{t} {i}" for i in range(3) for t in TEXTS]
        ids = [p.prompt_id for p in client.register([{"text": t} for t in texts], max_new_tokens=24)]
        deadline = time.monotonic() + 30
        while server_metric(url, "cache_server_generator_errors_total") < 3:
            assert time.monotonic() < deadline, "the server did not retry the engine"
            time.sleep(0.2)
        assert all(client.prompt(p).status == "pending" for p in ids)
        engine.start()
        client.wait_ready(ids, timeout_s=300)  # a failure raises here
        for pid in ids:
            state = client.prompt(pid)
            tokens = state.token_ids or []
            assert tokens == greedy_continuation(in_process, tokens[: state.prompt_len], 24)
        assert httpx.get(f"{url}/healthz").status_code == 200


def test_a_server_stopped_mid_generation_leaves_its_prompts_to_the_next(
    engine: VllmServer, engine_target: Path, in_process: torch.nn.Module, tmp_path: Path
) -> None:
    texts = [f"{t} {i}" for i in range(2) for t in TEXTS]
    with _served(engine_target, tmp_path / "store", engine) as url, CacheClient(url) as client:
        short = [p.prompt_id for p in client.register([{"text": t} for t in TEXTS[:2]], max_new_tokens=4)]
        ids = [p.prompt_id for p in client.register([{"text": t} for t in texts], max_new_tokens=160)]
        # Once the short responses are in, the long ones are being generated: a fixed wait can miss them
        # (an idle CPU ends them all within a second).
        deadline = time.monotonic() + 60
        while not all(client.prompt(p).status == "ready" for p in short):
            assert time.monotonic() < deadline, "the engine never answered"
            time.sleep(0.02)
        assert any(client.prompt(p).status == "pending" for p in ids)
        stopped_at = time.monotonic()
    assert time.monotonic() - stopped_at < 20  # generations in flight are dropped, not awaited
    with _served(engine_target, tmp_path / "store", engine) as url, CacheClient(url) as client:
        client.wait_ready(ids, timeout_s=300)
        for pid in ids:
            state = client.prompt(pid)
            tokens = state.token_ids or []
            prompt = torch.tensor([tokens[: state.prompt_len]])
            assert tokens == in_process.generate(prompt, max_new_tokens=160, do_sample=False)[0].tolist()


def test_parity_refuses_an_engine_without_a_speculative_config(
    engine: VllmServer, engine_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from eval_worker.cli import main
    from eval_worker.exit_codes import ExitCode

    with running_server(engine_target, tmp_path / "store") as url:
        argv = ["parity", str(tmp_path / "any-checkpoint"), "--engine", engine.url, "--server", url]
        assert main(argv) == ExitCode.engine
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no speculative-decoding counters" in err and "--speculative-config" in err
