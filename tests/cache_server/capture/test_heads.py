"""The heads read from the checkpoint's shards are the loaded model's, and the response checks made
from the raw last layer through them are the forward's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from cache_server.capture.heads import FinalNorm, Heads
from cache_server.capture.target import open_hf_target
from cache_server.capture.tokenizer import stop_token_ids
from testing.mtp_targets import save_deepseek_v3_mtp, save_qwen3_next_mtp
from tests.cache_server.reference import direct_layer_outputs

PROMPT = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11]


def test_heads_read_from_the_shards_equal_the_loaded_models_bit_for_bit(tiny_target: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    loaded, read = Heads.from_model(model), Heads.from_checkpoint(tiny_target, torch.float32)
    assert torch.equal(read.embed, loaded.embed) and torch.equal(read.lm_head, loaded.lm_head)
    assert read.final_norm is not None and loaded.final_norm is not None
    assert torch.equal(read.final_norm.weight, loaded.final_norm.weight)
    assert read.final_norm.eps == loaded.final_norm.eps
    last = direct_layer_outputs(tiny_target, PROMPT)[-1]
    with torch.inference_mode():
        assert torch.equal(read.final_norm(last), model.model.norm(last))


def test_heads_are_read_from_an_index_of_shards_without_the_other_weights(tiny_target: Path, tmp_path: Path) -> None:
    """The decoder's shard is garbage: reading the heads never touches it."""
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_target, sharded)
    tensors = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    heads = {k: v for k, v in tensors.items() if not k.startswith("model.layers.")}
    save_file(heads, sharded / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    (sharded / "model-00002-of-00002.safetensors").write_bytes(b"not a safetensors file")
    weight_map = {
        k: "model-00001-of-00002.safetensors" if k in heads else "model-00002-of-00002.safetensors" for k in tensors
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    read = Heads.from_checkpoint(sharded, torch.float32)
    assert torch.equal(read.lm_head, tensors["lm_head.weight"])
    with pytest.raises(Exception):  # noqa: B017 (the model itself cannot load: its decoder shard is garbage)
        AutoModelForCausalLM.from_pretrained(sharded)


def test_response_checks_from_the_last_layer_equal_the_forwards(tiny_target: Path) -> None:
    target = open_hf_target(tiny_target, device="cpu")
    assert target.forward is not None
    greedy = PROMPT + target.forward.generate([PROMPT], 12)[0]
    wrong = greedy[:-3] + [(t + 1) % 300 for t in greedy[-3:]]
    last = target.info.num_layers - 1
    for sequence in (greedy, wrong):
        (captured,) = target.capturer.capture([sequence], [len(PROMPT)], [last])
        assert not isinstance(captured, Exception)
        from_states = target.heads.response_misses(captured.states[last], torch.tensor(sequence), len(PROMPT), None)
        assert from_states == captured.greedy_mismatches
    assert [c.greedy_mismatches for c in target.capturer.capture([greedy, wrong], [len(PROMPT)] * 2, [last])] == [0, 3]  # type: ignore[union-attr]


def test_stop_ids_are_read_as_transformers_reads_them(tiny_target: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    eos = model.generation_config.eos_token_id
    assert stop_token_ids(tiny_target) == ([] if eos is None else [eos] if isinstance(eos, int) else list(eos))


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Qwen3-Next (a zero-centred final norm) and DeepSeek-V3 (a plain one) targets."""
    root = tmp_path_factory.mktemp("norms")
    return {
        "qwen3_next": save_qwen3_next_mtp(root / "qwen3_next", linear_attention=False),
        "deepseek_v3": save_deepseek_v3_mtp(root / "deepseek_v3"),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("kind", "zero_centered"), [("qwen3_next", True), ("deepseek_v3", False)])
def test_final_norms_of_each_kind_are_the_models_bit_for_bit(
    mtp_targets: dict[str, Path], kind: str, zero_centered: bool, dtype: torch.dtype
) -> None:
    target = mtp_targets[kind]
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).eval()
    loaded, read = Heads.from_model(model).final_norm, Heads.from_checkpoint(target, dtype).final_norm
    assert loaded is not None and read is not None
    assert loaded.zero_centered == read.zero_centered == zero_centered
    assert loaded.kind == read.kind == ("rmsnorm_zero_centered" if zero_centered else "rmsnorm")
    assert torch.equal(read.weight, loaded.weight) and read.weight.dtype == dtype and read.eps == loaded.eps
    last = direct_layer_outputs(target, PROMPT, dtype)[-1]  # [T, H] raw, before the final norm
    with torch.inference_mode():
        expected = model.model.norm(last)
    assert torch.equal(read(last), expected) and torch.equal(loaded(last), expected)
    # the other kind's formula is not the model's: the test tells the two apart
    assert not torch.equal(FinalNorm(read.weight, read.eps, not zero_centered)(last), expected)
