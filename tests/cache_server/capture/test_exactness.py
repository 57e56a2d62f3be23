"""Served states equal a direct transformers forward, bit for bit in float32, in request order."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.target import open_hf_target
from schemas.prompts import PromptSpec
from tests.cache_server.helpers import app_client, get_hidden, metric, register_ready
from tests.cache_server.reference import direct_layer_outputs

PROMPT = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11]
RESPONSE = [64, 65, 66, 400, 401, 7, 8]


def test_every_layer_is_bit_exact_in_request_order(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = register_ready(client, [{"token_ids": PROMPT, "response_token_ids": RESPONSE}])
        tensors, meta = get_hidden(client, pid, "5,0,3,1")
    expected = direct_layer_outputs(tiny_target, PROMPT + RESPONSE)
    hidden = tensors["hidden"]
    assert hidden.dtype == torch.float32 and hidden.shape == (len(PROMPT + RESPONSE), 4 * 64)
    for i, k in enumerate([5, 0, 3, 1]):
        assert torch.equal(hidden[:, i * 64 : (i + 1) * 64], expected[k]), f"layer {k} differs"
    assert tensors["token_ids"].tolist() == PROMPT + RESPONSE
    assert meta["layers"] == "5,0,3,1"
    assert meta["layer_convention"] == "decoder_output_0based"
    assert int(meta["prompt_len"]) == len(PROMPT)


def test_last_layer_is_raw_output_not_final_norm(tiny_target: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    with torch.inference_mode():
        normed = model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states[-1][0]
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = register_ready(client, [{"token_ids": PROMPT}])
        tensors, _ = get_hidden(client, pid, "5")
    assert not torch.allclose(tensors["hidden"], normed)
    assert torch.equal(tensors["hidden"], direct_layer_outputs(tiny_target, PROMPT)[5])


def test_generated_response_is_the_targets_greedy_continuation(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = register_ready(client, [{"text": "def fib(n):"}], generate=24)
        state = client.get(f"/prompts/{pid}").json()
        tensors, _ = get_hidden(client, pid, "2")
    tokens = state["token_ids"]
    prompt_len = state["prompt_len"]
    assert state["status"] == "ready" and state["num_tokens"] == prompt_len + 24
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    greedy = model.generate(torch.tensor([tokens[:prompt_len]]), max_new_tokens=24, do_sample=False)
    assert greedy[0].tolist() == tokens
    assert torch.equal(tensors["hidden"], direct_layer_outputs(tiny_target, tokens)[2])


def test_batched_computation_matches_single_forward(tiny_target: Path, tmp_path: Path) -> None:
    prompts = [PROMPT[: n + 2] + RESPONSE[:n] for n in (1, 3, 5, 7)]
    with app_client(tiny_target, tmp_path / "store") as client:
        ids = register_ready(client, [{"token_ids": p} for p in prompts])
        served = [get_hidden(client, pid, "0,5")[0]["hidden"] for pid in ids]
    for tokens, hidden in zip(prompts, served, strict=True):
        ref = direct_layer_outputs(tiny_target, tokens)
        torch.testing.assert_close(hidden, torch.cat([ref[0], ref[5]], dim=1), rtol=1e-5, atol=1e-5)


def test_token_range_and_bfloat16_bytes(tiny_target: Path, tmp_path: Path) -> None:
    tokens = PROMPT + RESPONSE
    with app_client(tiny_target, tmp_path / "store", dtype="bfloat16") as client:
        [pid] = register_ready(client, [{"token_ids": tokens}])
        tensors, meta = get_hidden(client, pid, "4,2", start=3, stop=9)
    expected = direct_layer_outputs(tiny_target, tokens, dtype=torch.bfloat16)
    assert tensors["hidden"].dtype == torch.bfloat16 and meta["dtype"] == "bfloat16"
    torch.testing.assert_close(tensors["hidden"], torch.cat([expected[4], expected[2]], dim=1)[3:9])
    assert tensors["token_ids"].tolist() == tokens[3:9]


def test_batched_generation_matches_one_prompt_at_a_time(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    prompts = [target.prompts.encode(PromptSpec(text=t)) for t in ("def fib(n):", "The quick brown fox jumps", "x")]
    batched = target.forward.generate(prompts, 20)  # one left-padded batch
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    for prompt, response in zip(prompts, batched, strict=True):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0].tolist()
        assert prompt + response == alone


def test_greedy_agreement_of_responses_is_recorded(tiny_target: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    with torch.inference_mode():
        argmax = model(torch.tensor([PROMPT + RESPONSE])).logits[0].argmax(-1).tolist()
    expected = sum(argmax[s - 1] != t for s, t in enumerate(PROMPT + RESPONSE) if s >= len(PROMPT))
    with app_client(tiny_target, tmp_path / "store") as client:
        [given] = register_ready(client, [{"token_ids": PROMPT, "response_token_ids": RESPONSE}])
        [generated] = register_ready(client, [{"token_ids": PROMPT}], generate=12)
        assert client.get(f"/prompts/{given}").json()["greedy_mismatches"] == expected > 0
        assert client.get(f"/prompts/{generated}").json()["greedy_mismatches"] == 0
        _, meta = get_hidden(client, given, "1")
    assert meta["greedy_mismatches"] == str(expected)


def test_the_ram_cache_serves_the_same_bits(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store", ram_cache_gb=0.01) as client:
        [pid] = register_ready(client, [{"token_ids": PROMPT, "response_token_ids": RESPONSE}])
        first, _ = get_hidden(client, pid, "5,0,3")  # decoded from the store, kept
        again, _ = get_hidden(client, pid, "3,5", start=2, stop=9)  # from RAM
        assert metric(client, "cache_server_ram_cache_hits_total") == 3  # layer 0 (read by register_ready), 3, 5
        assert metric(client, "cache_server_ram_cache_bytes") == 3 * len(PROMPT + RESPONSE) * 64 * 4
    expected = direct_layer_outputs(tiny_target, PROMPT + RESPONSE)
    assert torch.equal(first["hidden"], torch.cat([expected[k] for k in (5, 0, 3)], dim=1))
    assert torch.equal(again["hidden"], torch.cat([expected[k][2:9] for k in (3, 5)], dim=1))


def test_generate_batch_responses_are_each_prompts_own_greedy_tokens(tiny_target: Path, tmp_path: Path) -> None:
    texts = ["x", "def fib(n):", "The quick brown fox jumps over", "import numpy as np", "for i in", "Question:"]
    with app_client(tiny_target, tmp_path / "store", generate_batch=4, batch_tokens=64) as client:
        ids = register_ready(client, [{"text": t} for t in texts], generate=16)  # generated 4 then 2 at a time
        states = [client.get(f"/prompts/{pid}").json() for pid in ids]
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    for state in states:
        prompt = state["token_ids"][: state["prompt_len"]]
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
        assert state["token_ids"] == alone
        assert state["generator"] == {"kind": "hf", "url": None, "model": None, "version": None}


def test_a_device_map_over_the_layers_stores_the_same_bits(tiny_target: Path, tmp_path: Path) -> None:
    # Every module placed by name, all on the CPU here (tests/test_gpu.py runs "auto" over a node's GPUs).
    placement = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    placement |= {f"model.layers.{k}": "cpu" for k in range(6)}
    tokens = PROMPT + RESPONSE
    with app_client(tiny_target, tmp_path / "store", device_map=json.dumps(placement)) as client:
        [pid] = register_ready(client, [{"token_ids": PROMPT, "response_token_ids": RESPONSE}])
        tensors, _ = get_hidden(client, pid, "0,1,2,3,4,5")
        assert client.app.state.service.target.forward.device == torch.device("cpu")  # type: ignore[attr-defined]
    expected = direct_layer_outputs(tiny_target, tokens)
    assert torch.equal(tensors["hidden"], torch.cat(expected, dim=1))
