"""`eval-worker parity` against a real vLLM serving a DFlash drafter trained here as its speculative
config: every prompt's live rounds equal the offline chain rounds; a checkpoint that reads other
layers than the served one is caught, prompt by prompt."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from cache_server.capture.target import Target
from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.cli import main
from eval_worker.drafters.model import DFlashDrafter
from schemas.parity import ParityReport
from schemas.prompts import PromptSpec
from tests.support.checkpoints import save_hf_checkpoint
from tests.support.engine import VllmServer, vllm_python
from tests.support.servers import free_port, running_server
from tests.support.tiny_trainer import TinyTrainer, make_sequences, tiny_drafter_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TRAIN = ["def fib(n):", "The quick brown fox", "import numpy as np", "for i in range(10):", "class Stack:",
         "Question: what is the capital", "print(x.sum(axis=0))", "Speculative decoding drafts"]  # fmt: skip
HELD_OUT = ["A drafter reads the hidden", "return fib(n - 1) + fib"]
LAYERS, BLOCK, NEW_TOKENS = [1, 3, 5], 8, 48


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path, DFlashDrafter]]:
    """(engine URL, cache server URL, the served checkpoint, its drafter)."""
    if vllm_python() is None:
        pytest.fail("the vLLM environment .venv-vllm is missing: ./dev test (or .ci/run) builds it")
    tmp = tmp_path_factory.mktemp("parity")
    model_dir = build_tiny_model(tmp / "target", layers=6, hidden=128, head_dim=32, seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    target = Target(model_dir, device="cpu")
    prompts = [target.encode(PromptSpec(text=t)) for t in TRAIN]
    torch.manual_seed(0)
    cfg = tiny_drafter_config(AutoConfig.from_pretrained(model_dir), LAYERS, block_size=BLOCK)
    drafter = DFlashDrafter(cfg, len(LAYERS))
    data = make_sequences(model, prompts, LAYERS, NEW_TOKENS)
    TinyTrainer(drafter, data, model.get_input_embeddings().weight, model.get_output_embeddings().weight).run(40)
    served = save_hf_checkpoint(tmp / "drafter", drafter, extra=ENGINE_KEYS)
    spec = json.dumps({"method": "dflash", "model": str(served), "num_speculative_tokens": BLOCK - 1})
    engine = VllmServer(model_dir, free_port(), tmp / "vllm.log", "--speculative-config", spec)
    engine.start()
    try:
        with running_server(model_dir, tmp / "store") as url, CacheClient(url) as client:
            specs = [{"text": t, "sets": ["parity"]} for t in TRAIN + HELD_OUT]
            client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=NEW_TOKENS)])
            yield engine.url, url, served, drafter
    finally:
        engine.stop()


ENGINE_KEYS = {
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def _parity(engine: str, server: str, checkpoint: Path, out: Path) -> tuple[int, ParityReport]:
    code = main(["parity", str(checkpoint), "--engine", engine, "--server", server, "--device", "cpu",
                 "--out", str(out)])  # fmt: skip
    return code, ParityReport.model_validate_json(out.read_text())


def test_live_rounds_equal_the_offline_rounds_on_every_prompt(
    setup: tuple[str, str, Path, DFlashDrafter], tmp_path: Path
) -> None:
    engine, server, served, _ = setup
    code, report = _parity(engine, server, served, tmp_path / "parity.json")
    assert code == 0 and report.agreeing == len(report.prompts) == len(TRAIN + HELD_OUT)
    assert report.speculative_tokens == BLOCK - 1
    for p in report.prompts:  # exact, but where the engine counts drafts past max_tokens in the last round
        assert p.live_drafts == p.offline_rounds
        assert p.live_accepted == p.offline_accepted or p.why.startswith("identical but the last round")
    accepted = [p.live_accepted for p in report.prompts]
    assert report.live_tau is not None and report.live_tau > 2  # several tokens per round: not trivial
    assert any(0 < p.live_accepted < (BLOCK - 1) * p.live_drafts for p in report.prompts)  # partial rounds too
    assert sum(accepted) > 0 and all(p.first_token_difference is None for p in report.prompts)


def test_a_checkpoint_reading_other_layers_than_the_served_one_is_caught(
    setup: tuple[str, str, Path, DFlashDrafter], tmp_path: Path
) -> None:
    engine, server, _, drafter = setup
    shifted_cfg = dataclasses.replace(drafter.cfg, target_layer_ids=tuple(k - 1 for k in LAYERS))  # one layer off
    shifted = DFlashDrafter(shifted_cfg, len(LAYERS))
    shifted.load_state_dict(drafter.state_dict())
    checkpoint = save_hf_checkpoint(tmp_path / "shifted", shifted, extra=ENGINE_KEYS)
    code, report = _parity(engine, server, checkpoint, tmp_path / "parity.json")
    assert code == 1 and report.agreeing < len(report.prompts)
    assert report.offline_tau is not None and report.live_tau is not None and report.offline_tau < report.live_tau
    assert any("offline" in p.why and not p.agrees for p in report.prompts)
