"""`doctor` on a checkpoint trained on HF's last `hidden_states` entry (the last layer after the final
norm) where the cache serves the raw output: the normed reading scores clearly higher, and says so.

The target's final norm gets a non-uniform weight, as trained targets have (a tiny random target's is
all ones, and a norm of ones changes one tap's scale only, which the drafter's hidden_norm undoes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.target import open_hf_target
from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.cli import main
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.prompts import PromptSpec
from testing.checkpoints import save_hf_checkpoint
from testing.live_loop import target_heads
from testing.servers import running_server
from testing.tiny_trainer import Sequences, TinyTrainer, make_sequences, tiny_drafter_config
from tests.eval_worker.helpers import BLOCK_SIZE, NEW_TOKENS, TRAIN_TEXTS

pytestmark = pytest.mark.slow
LAST = [5]  # one tap, the last decoder layer of 6: the drafter reads nothing else


def test_doctor_names_a_checkpoint_trained_on_the_normed_last_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target_dir = build_tiny_model(tmp_path / "target", layers=6, hidden=64, vocab=512, seed=0)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        spread = torch.linspace(0.1, 3.0, 64)
        model.model.norm.weight.copy_(spread[torch.randperm(64, generator=torch.Generator().manual_seed(0))])
    model.save_pretrained(target_dir)
    encoder = open_hf_target(target_dir, device="cpu")
    data = make_sequences(model, [encoder.prompts.encode(PromptSpec(text=t)) for t in TRAIN_TEXTS], LAST, NEW_TOKENS)
    with torch.no_grad():  # HF's last hidden_states entry, through HF's own norm module
        taps = [model.model.norm(t) for t in data.taps]
    torch.manual_seed(0)
    drafter = DFlashDrafter(tiny_drafter_config(model.config, LAST, block_size=BLOCK_SIZE), len(LAST))
    TinyTrainer(drafter, Sequences(data.token_ids, taps, data.prompt_lens), *target_heads(model), lr=1e-3, seed=0).run(
        120
    )
    checkpoint = save_hf_checkpoint(tmp_path / "normed", drafter)
    with running_server(target_dir, tmp_path / "store") as url, CacheClient(url) as client:
        specs = data.prompt_specs()
        client.wait_ready([p.prompt_id for p in client.register(specs)])
        assert main(["doctor", str(checkpoint), "--server", url, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "last layer normed    [5]" in out
    assert "(last layer normed) scores" in out and "HF's last hidden_states entry" in out, out
