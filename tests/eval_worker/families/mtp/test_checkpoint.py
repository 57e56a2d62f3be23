"""MTP heads load strictly, from the target's own directory (sharded too: only the head's tensors are
read) or from an MTP-only checkpoint, and are refused by name for anything else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eval_worker.checkpoints.info import describe_checkpoint
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.raw import SafetensorsState, read_raw
from eval_worker.errors import CheckpointRefused
from eval_worker.families import family_of
from eval_worker.families.mtp.drafter import MtpDrafter
from schemas.model import ModelInfo
from testing.mtp_targets import save_deepseek_v3_mtp, save_qwen3_next_mtp

HEAD = "model.layers.2."  # the tiny DeepSeek's two layers, then its head


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_deepseek_v3_mtp(tmp_path_factory.mktemp("mtp") / "deepseek")


def _info(target: Path, **changes: object) -> ModelInfo:
    cfg = json.loads((target / "config.json").read_text())
    fields = {
        "name": "tiny",
        "fingerprint": "f",
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "max_position_embeddings": 4096,
        "dtype": "float32",
        "capture_layers": [0, 1],
    }
    return ModelInfo.model_validate(fields | changes)


def _load(path: Path, target: Path, **changes: object) -> object:
    raw = read_raw(path)
    return family_of(raw.config).load(path, raw, _info(target, **changes), LoadRequest())


def _weights(target: Path) -> dict[str, torch.Tensor]:
    return load_file(target / "model.safetensors")


def _copy(target: Path, out: Path, tensors: dict[str, torch.Tensor], config: dict[str, object] | None = None) -> Path:
    """A checkpoint directory with the target's config (changed by `config`) and these tensors."""
    out.mkdir()
    cfg = json.loads((target / "config.json").read_text()) | (config or {})
    (out / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, out / "model.safetensors")
    return out


def test_a_target_directory_loads_its_head_alone(deepseek: Path, tmp_path: Path) -> None:
    weights = _weights(deepseek)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(deepseek / "config.json", sharded)
    head = {k: v for k, v in weights.items() if k.startswith(HEAD)}
    body = {k: v for k, v in weights.items() if not k.startswith(HEAD)}
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = {k: first for k in body} | {k: second for k in head}
    save_file(body, sharded / first)
    save_file(head, sharded / second)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    raw = read_raw(sharded)
    loaded = family_of(raw.config).load(sharded, raw, _info(deepseek), LoadRequest())
    assert isinstance(raw.state, SafetensorsState)
    assert not any(k.startswith("model.layers.0.") for k in raw.state._read)  # the target's layers never read
    assert loaded.family == "mtp" and loaded.layout == "deepseek"
    assert loaded.target_layer_ids == (1,) and loaded.layer_ids_source == "family"
    assert any("not read" in w for w in loaded.warnings)  # the embed_tokens and shared_head.head copies
    drafter = loaded.drafter
    assert isinstance(drafter, MtpDrafter)
    assert torch.equal(drafter.proj.weight, weights[HEAD + "eh_proj.weight"])
    assert torch.equal(drafter.norm_out.weight, weights[HEAD + "shared_head.norm.weight"])
    experts = drafter.block.mlp.experts
    gate, up = weights[HEAD + "mlp.experts.1.gate_proj.weight"], weights[HEAD + "mlp.experts.1.up_proj.weight"]
    assert torch.equal(experts.gate_up_proj[1], torch.cat([gate, up]))


def test_an_mtp_only_checkpoint_loads_the_same_head(deepseek: Path, tmp_path: Path) -> None:
    weights = _weights(deepseek)
    only = _copy(deepseek, tmp_path / "mtp-only", {k: v for k, v in weights.items() if k.startswith(HEAD)})
    a, b = _load(deepseek, deepseek), _load(only, deepseek)
    ours, theirs = a.drafter.state_dict(), b.drafter.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_refusals_name_what_is_wrong(deepseek: Path, tmp_path: Path) -> None:
    weights = _weights(deepseek)
    head = {k: v for k, v in weights.items() if k.startswith(HEAD)}
    missing = _copy(deepseek, tmp_path / "missing", {k: v for k, v in head.items() if "hnorm" not in k})
    with pytest.raises(CheckpointRefused, match=r"missing keys.*norm_hidden"):
        _load(missing, deepseek)
    wide = dict(head) | {HEAD + "eh_proj.weight": torch.zeros(128, 128)}
    with pytest.raises(CheckpointRefused, match=r"proj.weight has shape \[128, 128\]"):
        _load(_copy(deepseek, tmp_path / "shape", wide), deepseek)
    with pytest.raises(CheckpointRefused, match="declares 2 MTP heads"):
        _load(_copy(deepseek, tmp_path / "two", head, {"num_nextn_predict_layers": 2}), deepseek)
    with pytest.raises(CheckpointRefused, match="is not the target's"):
        _load(deepseek, deepseek, num_layers=3)
    with pytest.raises(CheckpointRefused, match="--inert-config-keys wandb_id"):
        _load(_copy(deepseek, tmp_path / "unknown", head, {"wandb_id": "x"}), deepseek)
    with pytest.raises(CheckpointRefused, match="scoring_func 'softmax'"):
        _load(_copy(deepseek, tmp_path / "softmax", head, {"scoring_func": "softmax"}), deepseek)
    with pytest.raises(CheckpointRefused, match="quantization_config"):
        _load(_copy(deepseek, tmp_path / "fp8", head, {"quantization_config": {"quant_method": "fp8"}}), deepseek)


def test_a_config_without_heads_is_not_mtp(deepseek: Path, tmp_path: Path) -> None:
    no_heads = _copy(deepseek, tmp_path / "none", {}, {"num_nextn_predict_layers": 0})
    with pytest.raises(CheckpointRefused, match="checkpoint of none of the families"):
        family_of(read_raw(no_heads).config)


def test_inspect_describes_both_layouts(deepseek: Path, tmp_path: Path) -> None:
    qwen = save_qwen3_next_mtp(tmp_path / "qwen", linear_attention=False)
    deepseek_lines = describe_checkpoint(deepseek)
    assert "MTP (deepseek layout" in deepseek_lines and "model.layers.2.*" in deepseek_lines
    qwen_lines = describe_checkpoint(qwen)
    assert "MTP (qwen3_next layout" in qwen_lines and "mtp.*" in qwen_lines
