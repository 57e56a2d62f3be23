"""speculators' own EAGLE-3 training (0.9, run in the peers' environment) fed the same cached states two ways:
its offline files read by its `ArrowDataset`, and this project's `CacheDataset` over a real server. Through
its `_setup_dataloader` and `shift_batch`, from one seed, the packed steps and per-step losses are identical;
the states it trained on are what a direct transformers forward computes at its aux ids."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from testing.peers import REPO, run_in_peers
from testing.servers import running_server
from testing.taps import target_forward

pytestmark = [pytest.mark.peers, pytest.mark.slow]
LAYERS = 8  # speculators' default aux ids [2, n//2, n-3] = [2, 4, 5], HF hidden_states indices
PROMPTS = [[5 + i, 17, 3 + 2 * i, 99] for i in range(16)]
NEW_TOKENS = 8  # 12-token samples, three to a packed row of 40: six rows for 16 prompts
STEPS = 4
SCRIPT = REPO / "testing" / "peer_training.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    tmp = tmp_path_factory.mktemp("speculators-dataset")
    target = build_tiny_model(tmp / "target", layers=LAYERS, hidden=64)
    with running_server(target, tmp / "store") as url, CacheClient(url) as client:
        specs = [{"token_ids": p, "sets": ["train"]} for p in PROMPTS]
        client.wait_ready([r.prompt_id for r in client.register(specs, max_new_tokens=NEW_TOKENS)])
        out = run_in_peers(SCRIPT, url, target, tmp, "train", str(STEPS))
    return json.loads(out.strip().splitlines()[-1]), target, tmp / "offline"


def test_both_ways_in_train_identically_step_for_step(trained: tuple[dict[str, Any], Path, Path]) -> None:
    result, _, _ = trained
    arrow, cache = result["arrow"], result["cache"]
    assert result["layers"] == [2, 4, 5]
    # the listing's num_tokens (no fetch) are the lengths speculators' preprocessing counted
    assert result["approx_lengths"]["cache"] == result["approx_lengths"]["arrow"] == [len(PROMPTS[0]) + NEW_TOKENS] * 16
    assert result["same_samples"]  # index for index: keys, dtypes, values
    assert cache["tokens"] == arrow["tokens"]  # the same samples packed into each step, in the same order
    assert all(len(step) > len(PROMPTS[0]) + NEW_TOKENS for step in arrow["tokens"])  # several per row
    assert len(arrow["losses"]) == len(cache["losses"]) == STEPS
    assert all(math.isfinite(x) for x in arrow["losses"])
    assert cache["losses"] == arrow["losses"]  # bit for bit: same states, same seed, same order
    assert len(set(arrow["losses"])) == STEPS  # the model trains: every step's loss differs


def test_the_states_trained_on_are_a_direct_forwards(trained: tuple[dict[str, Any], Path, Path]) -> None:
    """The offline files (written from the cache) hold speculators' layout: its aux ids as HF hidden_states
    indices, then the last decoder layer's raw output (before the final norm), as a transformers forward has them."""
    result, target, offline = trained
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    seen = set()
    for i in range(len(PROMPTS)):
        stored = load_file(offline / "hidden_states" / f"hs_{i}.safetensors")
        ids = stored["token_ids"][None]
        with torch.no_grad():
            hf = model(input_ids=ids, output_hidden_states=True).hidden_states
        last = target_forward(model, ids, [LAYERS - 1]).taps[0]
        want = torch.stack([*(hf[j][0] for j in result["layers"]), last], dim=1)  # [T, aux + 1, H]
        torch.testing.assert_close(stored["hidden_states"].float(), want, rtol=1e-5, atol=1e-5)
        seen.add(tuple(stored["token_ids"][: len(PROMPTS[0])].tolist()))
    assert seen == {tuple(p) for p in PROMPTS}
