"""The in-process test engine (`testing/spec_engine.py`) on loopback, read through parity's own client:
at T = 0 it is the target's greedy generation and its counters move by exactly the offline chain walk's
rounds; a seed reproduces a sample; the deliberately lossy engine leaves the greedy path at a tiny T."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN
from eval_worker.parity.compare import compare_prompt
from eval_worker.parity.engine import VllmEngine
from schemas.model import ModelInfo
from testing.all_anchor import all_anchor_taus
from testing.checkpoints import save_hf_checkpoint
from testing.live_loop import target_heads
from testing.spec_engine import VERSION, SpecCompletions, spec_engine
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import BLOCK_SIZE, LAYER_IDS, NEW_TOKENS

K = BLOCK_SIZE - 1
_PER_POSITION = re.compile(
    r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$', re.M
)


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, trained_drafter: DFlashDrafter, target_info: ModelInfo
) -> LoadedCheckpoint:
    """The trained drafter saved in the published layout and loaded back strictly, as parity loads it."""
    path = save_hf_checkpoint(tmp_path_factory.mktemp("engine") / "drafter", trained_drafter)
    return load_checkpoint(path, target_info)


@pytest.fixture(scope="module")
def engine(tiny_target: Path, checkpoint: LoadedCheckpoint) -> Iterator[str]:
    with spec_engine(SpecCompletions(tiny_target, checkpoint, k=K)) as url:
        yield url


@pytest.fixture(scope="module")
def lossy_engine(tiny_target: Path, trained_drafter: DFlashDrafter) -> Iterator[str]:
    with spec_engine(SpecCompletions(tiny_target, trained_drafter, k=K, layer_ids=LAYER_IDS, lossless=False)) as url:
        yield url


def per_position(url: str) -> list[float]:
    """The per-position accepted counters, by position."""
    found = {int(p): float(v) for p, v in _PER_POSITION.findall(httpx.get(f"{url}/metrics").text)}
    return [found[i] for i in range(len(found))]


def complete(url: str, prompt: list[int], **fields: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "return_token_ids": True, "ignore_eos": True, **fields}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return dict(response.json()["choices"][0])


def test_parity_reads_it_and_its_greedy_rounds_are_the_offline_walks(
    engine: str, tiny_target: Path, target: Any, trained_drafter: DFlashDrafter, sequences: Sequences
) -> None:
    vllm = VllmEngine(engine)
    assert (vllm.model, vllm.version, vllm.speculative_tokens()) == (tiny_target.name, VERSION, K)
    embed, lm_head = target_heads(target)
    positions_before, accepted_before = per_position(engine), vllm.counters().accepted
    for i, (ids, taps, n) in enumerate(zip(sequences.token_ids, sequences.taps, sequences.prompt_lens, strict=True)):
        before = vllm.counters()
        response = vllm.greedy(ids[:n].tolist(), NEW_TOKENS)
        live = vllm.counters() - before
        assert response == ids[n:].tolist()  # T = 0: the target's own greedy generation
        offline = all_anchor_taus(trained_drafter, taps, ids.tolist(), n, (), embed, lm_head)[CHAIN]
        verdict = compare_prompt(str(i), ids[n:].tolist(), response, offline, live, K)
        assert verdict.agrees and live.drafts == len(offline), verdict.why
    positions = [after - b for after, b in zip(per_position(engine), positions_before, strict=True)]
    assert positions == sorted(positions, reverse=True)  # position i accepted only after position i-1
    assert sum(positions) == vllm.counters().accepted - accepted_before > 0
    vllm.close()


def test_a_seed_reproduces_its_sample(engine: str, sequences: Sequences) -> None:
    prompt = sequences.token_ids[0][: sequences.prompt_lens[0]].tolist()
    first = complete(engine, prompt, temperature=1.0, seed=7)
    assert complete(engine, prompt, temperature=1.0, seed=7)["token_ids"] == first["token_ids"]
    assert complete(engine, prompt, temperature=1.0, seed=8)["token_ids"] != first["token_ids"]
    assert first["token_ids"] != sequences.token_ids[0][sequences.prompt_lens[0] :].tolist()
    assert len(first["token_ids"]) == NEW_TOKENS and first["finish_reason"] == "length"


def test_a_stop_token_ends_the_output(engine: str, sequences: Sequences) -> None:
    n = sequences.prompt_lens[0]
    greedy = sequences.token_ids[0][n:].tolist()
    stop = greedy[5]
    choice = complete(engine, sequences.token_ids[0][:n].tolist(), temperature=0.0, stop_token_ids=[stop])
    assert choice["token_ids"] == greedy[: greedy.index(stop) + 1]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)


# The top-two logit gap on this target's greedy paths falls to ~1e-3, so at T = 1e-3 a lossless sampler
# itself leaves the greedy path now and then (e^-2.6 at one position); at 1e-4 every gap is >= 11 nats.
TINY_T = 1e-4


def test_only_the_lossy_engine_leaves_the_greedy_path_at_a_tiny_temperature(
    engine: str, lossy_engine: str, sequences: Sequences
) -> None:
    for i, (ids, n) in enumerate(zip(sequences.token_ids, sequences.prompt_lens, strict=True)):
        prompt, greedy = ids[:n].tolist(), ids[n:].tolist()
        assert complete(engine, prompt, temperature=TINY_T, seed=i)["token_ids"] == greedy
        lossy = complete(lossy_engine, prompt, temperature=TINY_T, seed=i)["token_ids"]
        assert lossy[0] == greedy[0]  # the first token comes from the plain sampler, which is right
        assert lossy != greedy
