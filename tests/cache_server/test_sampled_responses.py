"""Sampled responses through a real server (in-process app): each sample a prompt of its own, drawn
reproducibly from the target at its setting (checked against a direct sampling loop over transformers'
own warpers), its provenance everywhere, and its support checked at capture."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.compute.registry import prompt_id_for
from schemas.hidden import HiddenMetadata
from schemas.sampling import SamplingParams
from tests.cache_server.helpers import app_client, error_message, get_hidden

NEW_TOKENS = 12
PROMPT = "def fib(n):"
SETTING = {"temperature": 1.0, "top_p": 0.9, "top_k": 20}


@pytest.fixture(scope="module")
def peaked_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm_head x 8: a few likely tokens per position, as a trained model has (a random one is flat)."""
    return build_tiny_model(tmp_path_factory.mktemp("peaked"), layers=4, hidden=64, logit_scale=8.0, seed=0)


@pytest.fixture(scope="module")
def other_peaked_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("peaked-2"), layers=4, hidden=64, logit_scale=8.0, seed=1)


def _direct_sample(model_dir: Path, prompt: list[int], seed: int) -> list[int]:
    """A full forward per token, transformers' warpers, one multinomial draw per token from `seed`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generator, ids = torch.Generator().manual_seed(seed), list(prompt)
    warpers = [TemperatureLogitsWarper(1.0), TopKLogitsWarper(20), TopPLogitsWarper(0.9)]
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[:, -1].float()
            for warp in warpers:
                logits = warp(None, logits)  # type: ignore[arg-type]
            ids.append(int(torch.multinomial(logits.softmax(dim=-1)[0], 1, generator=generator)))
    return ids[len(prompt) :]


def test_samples_are_prompts_of_their_own_drawn_reproducibly_with_their_provenance(
    peaked_target: Path, tmp_path: Path
) -> None:
    generate = {"max_new_tokens": NEW_TOKENS, **SETTING, "seed": 7, "samples": 3}
    with app_client(peaked_target, tmp_path / "store") as client:
        body = {"prompts": [{"text": PROMPT, "sets": ["code"]}], "generate": generate}
        sampled = [p["prompt_id"] for p in client.post("/prompts", json=body).json()["prompts"]]
        greedy_body = {"prompts": [{"text": PROMPT, "sets": ["code"]}], "generate": {"max_new_tokens": NEW_TOKENS}}
        [greedy] = [p["prompt_id"] for p in client.post("/prompts", json=greedy_body).json()["prompts"]]
        again = [p["prompt_id"] for p in client.post("/prompts", json=body).json()["prompts"]]
        assert again == sampled and len(set(sampled)) == 3 and greedy not in sampled  # idempotent, never colliding
        for i, pid in enumerate(sampled):
            _, meta = get_hidden(client, pid, "0")
            state = client.get(f"/prompts/{pid}").json()
            prompt, response = state["token_ids"][: state["prompt_len"]], state["token_ids"][state["prompt_len"] :]
            assert response == _direct_sample(peaked_target, prompt, 7 + i)
            want = SamplingParams(**SETTING, seed=7 + i)
            assert SamplingParams.model_validate(state["sampling"]) == want
            assert (state["outside_support"], state["greedy_mismatches"]) == (0, None)
            assert HiddenMetadata.from_strings(meta).sampling_params == want
            assert pid == prompt_id_for(tuple(prompt), None, NEW_TOKENS, want)
        responses = {tuple(client.get(f"/prompts/{pid}").json()["token_ids"]) for pid in sampled}
        assert len(responses) == 3  # three seeds, three responses (a peaked target still samples)
        get_hidden(client, greedy, "0")
        assert client.get(f"/prompts/{greedy}").json()["sampling"] is None
        [code] = client.get("/sets").json()["sets"]
        assert code["settings"] == {"T=1 top_p=0.9 top_k=20": 3, "T=0": 1}


def test_a_response_from_another_model_is_flagged_by_the_support_check(
    peaked_target: Path, other_peaked_target: Path, tmp_path: Path
) -> None:
    with app_client(peaked_target, tmp_path / "store") as client:
        prompt_ids = list(AutoTokenizer.from_pretrained(peaked_target)(PROMPT).input_ids)
        declared = {**SETTING, "seed": 0}
        checked = {}
        for name, model in (("own", peaked_target), ("other", other_peaked_target)):
            response = _direct_sample(model, prompt_ids, 0)
            engine = {"kind": "engine", "url": "http://127.0.0.1:9", "model": name, "version": "1"}
            spec = {"token_ids": prompt_ids, "response_token_ids": response, "sampling": declared, "generator": engine}
            [given] = client.post("/prompts", json={"prompts": [spec]}).json()["prompts"]
            _, meta = get_hidden(client, given["prompt_id"], "0")
            state = client.get(f"/prompts/{given['prompt_id']}").json()
            assert state["generator"] == engine and meta["generator"] == f"engine http://127.0.0.1:9 {name} 1"
            checked[name] = state["outside_support"]
        assert checked["own"] == 0 and checked["other"] > NEW_TOKENS // 3


@pytest.mark.parametrize(
    ("generate", "wanted"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
        ({"temperature": 1.0, "top_k": -1}, "top_k"),
        ({"temperature": 1.0, "samples": 0}, "samples"),
        ({"samples": 2}, "samples > 1 needs temperature > 0"),
    ],
)
def test_sampling_out_of_range_is_refused_with_one_line(
    peaked_target: Path, tmp_path: Path, generate: dict, wanted: str
) -> None:
    with app_client(peaked_target, tmp_path / "store") as client:
        body = {"prompts": [{"text": PROMPT}], "generate": {"max_new_tokens": 4, **generate}}
        message = error_message(client.post("/prompts", json=body), 422, "invalid_request")
        assert wanted in message and "\n" not in message
        assert client.get("/prompts").json()["total"] == 0
