"""Eval-worker fixtures: the shared tiny target loaded once, its greedy continuations, a trained drafter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval_worker.families.dflash.config import DFlashConfig
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.model import ModelInfo
from testing.live_loop import target_heads
from testing.tiny_trainer import Sequences, TinyTrainer, make_sequences, tiny_drafter_config
from tests.eval_worker.helpers import (
    BLOCK_SIZE,
    EAGLE_LAYER_IDS,
    HELD_OUT_TEXTS,
    LAYER_IDS,
    NEW_TOKENS,
    TRAIN_TEXTS,
)


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny tensors: extra intra-op threads only spin, and on 2 shared cores they thrash badly."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def target(tiny_target: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def target_info(target: Any) -> ModelInfo:
    c = target.config
    return ModelInfo(
        name="tiny",
        fingerprint="tiny-fp",
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings,
        dtype="float32",
        capture_layers=list(range(c.num_hidden_layers)),
    )


@pytest.fixture(scope="session")
def prompts(tiny_target: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    return [list(tokenizer(t)["input_ids"]) for t in TRAIN_TEXTS + HELD_OUT_TEXTS]


@pytest.fixture(scope="session")
def sequences(target: Any, prompts: list[list[int]]) -> Sequences:
    """Prompt + the target's greedy response (NEW_TOKENS tokens) and their taps, for every prompt."""
    return make_sequences(target, prompts, LAYER_IDS, NEW_TOKENS)


@pytest.fixture(scope="session")
def drafter_config(target: Any) -> DFlashConfig:
    return tiny_drafter_config(target.config, LAYER_IDS, block_size=BLOCK_SIZE, num_layers=1)


@pytest.fixture(scope="session")
def trained_drafter(target: Any, sequences: Sequences, drafter_config: DFlashConfig) -> DFlashDrafter:
    """A drafter trained briefly on the training prompts' continuations: right often, not always."""
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_config, len(LAYER_IDS))
    n = len(TRAIN_TEXTS)
    train = Sequences(sequences.token_ids[:n], sequences.taps[:n], sequences.prompt_lens[:n])
    embed, lm_head = target_heads(target)
    TinyTrainer(drafter, train, embed, lm_head, lr=1e-3, seed=0).run(120)
    return drafter


@pytest.fixture(scope="session")
def eagle_target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-layer tiny target: EAGLE-3's default taps (layer inputs 2, 6, 9) are distinct layers of it."""
    from cache_server.capture.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("eagle-target"), layers=12, hidden=64, vocab=512, seed=2)


@pytest.fixture(scope="session")
def eagle_target(eagle_target_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(eagle_target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def eagle_sequences(eagle_target: Any, eagle_target_dir: Path) -> Sequences:
    """Prompt + greedy response and the taps at EAGLE-3's default layers (decoder outputs 1, 5, 8)."""
    tokenizer = AutoTokenizer.from_pretrained(eagle_target_dir)
    prompts = [list(tokenizer(t)["input_ids"]) for t in TRAIN_TEXTS + HELD_OUT_TEXTS]
    return make_sequences(eagle_target, prompts, EAGLE_LAYER_IDS, NEW_TOKENS)
