from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint, load_with_spec
from eval_worker.errors import CheckpointRefused
from eval_worker.families.dflash.checkpoint import expected_shapes
from eval_worker.families.dflash.config import DFlashConfig, HfLayout
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions
from testing.checkpoints import save_hf_checkpoint, save_torch_checkpoint
from tests.eval_worker.helpers import random_drafter, small_config, small_target

TARGET = small_target()  # 6 layers, hidden 32, vocab 100


def _hf_dir(tmp_path: Path, cfg: DFlashConfig | None = None, layout: HfLayout = "published") -> Path:
    cfg = cfg or small_config()
    return save_hf_checkpoint(tmp_path / "hf", random_drafter(cfg, 3), layout=layout)


def _rewrite(ckpt: Path, *, config: dict[str, Any] | None = None, state: dict[str, torch.Tensor] | None = None) -> None:
    if config is not None:
        (ckpt / "config.json").write_text(json.dumps(config))
    if state is not None:
        save_file(state, ckpt / "model.safetensors")


@pytest.mark.parametrize("layout", ["published", "top_level", "block_in_dflash_config"])
def test_hf_layouts_load_with_exact_names(tmp_path: Path, layout: HfLayout) -> None:
    cfg = small_config()
    saved = random_drafter(cfg, 3)
    ckpt = save_hf_checkpoint(tmp_path / layout, saved, layout=layout)
    raw = json.loads((ckpt / "config.json").read_text())
    assert ("mask_token_id" in raw) == (layout == "top_level")
    assert ("block_size" in raw.get("dflash_config", {})) == (layout == "block_in_dflash_config")

    loaded = load_checkpoint(ckpt, TARGET)
    assert (loaded.format, loaded.config, loaded.layer_ids_source) == ("hf_dir", cfg, "checkpoint")
    assert loaded.target_layer_ids == (1, 2, 4)
    names = list(loaded.drafter.state_dict())
    assert len(names) == 11 * cfg.num_layers + 3
    assert names == list(expected_shapes(cfg, 3))
    assert not any(n.endswith(".bias") or "embed" in n or "lm_head" in n for n in names)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(loaded.drafter.state_dict()[name], tensor), name


def test_published_key_names(tmp_path: Path) -> None:
    keys = set(load_file(_hf_dir(tmp_path) / "model.safetensors"))
    for name in [
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.1.self_attn.q_proj.weight",
        "layers.1.self_attn.k_norm.weight",
        "layers.0.mlp.down_proj.weight",
        "layers.0.post_attention_layernorm.weight",
    ]:
        assert name in keys


def test_torch_dict_with_step_epoch_and_embedded_config(tmp_path: Path) -> None:
    drafter = random_drafter(small_config(), 3)
    path = save_torch_checkpoint(tmp_path / "ckpt.pt", drafter, global_step=1200, epoch=3)
    loaded = load_checkpoint(path, TARGET)
    assert (loaded.format, loaded.step, loaded.epoch) == ("torch_dict", 1200, 3)
    assert torch.equal(loaded.drafter.fc.weight, drafter.fc.weight)


def test_torch_dict_without_config_needs_a_config_path(tmp_path: Path) -> None:
    drafter = random_drafter(small_config(), 3)
    path = save_torch_checkpoint(tmp_path / "ckpt.pt", drafter, global_step=5, epoch=0, include_config=False)
    with pytest.raises(
        CheckpointRefused, match=r"carries no 'config' dict; pass the drafter's config\.json path with --config"
    ):
        load_checkpoint(path, TARGET)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(small_config().to_hf_dict("top_level")))
    assert load_checkpoint(path, TARGET, config_path=config_path).step == 5


class _NotAllowed:
    pass


def test_torch_dict_is_read_with_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    state = OrderedDict(random_drafter(small_config(), 3).state_dict())
    torch.save({"model_state_dict": state, "global_step": 1, "epoch": 0, "extra": _NotAllowed()}, path)
    with pytest.raises(CheckpointRefused, match="weights_only=True"):
        load_checkpoint(path, TARGET)


def test_missing_key_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    state = load_file(ckpt / "model.safetensors")
    del state["layers.1.self_attn.k_norm.weight"]
    _rewrite(ckpt, state=state)
    with pytest.raises(CheckpointRefused, match=r"missing keys \['layers.1.self_attn.k_norm.weight'\]"):
        load_checkpoint(ckpt, TARGET)


def test_unexpected_key_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    state = load_file(ckpt / "model.safetensors")
    state["embed_tokens.weight"] = torch.zeros(100, 32)
    _rewrite(ckpt, state=state)
    with pytest.raises(CheckpointRefused, match=r"unexpected keys \['embed_tokens.weight'\]"):
        load_checkpoint(ckpt, TARGET)


def test_wrong_tensor_shape_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    state = load_file(ckpt / "model.safetensors")
    state["layers.0.mlp.up_proj.weight"] = torch.zeros(40, 32)
    _rewrite(ckpt, state=state)
    with pytest.raises(CheckpointRefused, match=r"layers.0.mlp.up_proj.weight has shape \[40, 32\].*\[48, 32\]"):
        load_checkpoint(ckpt, TARGET)


def test_four_tap_fc_with_five_layer_config_is_refused(tmp_path: Path) -> None:
    cfg = small_config(target_layer_ids=(1, 2, 3, 4, 5))
    ckpt = save_hf_checkpoint(tmp_path / "c", random_drafter(cfg, 4))
    with pytest.raises(CheckpointRefused, match=r"fc.weight has shape \[32, 128\] = 4 taps.*\[1, 2, 3, 4, 5\]"):
        load_checkpoint(ckpt, TARGET)


def test_five_tap_fc_with_four_layer_config_is_refused(tmp_path: Path) -> None:
    cfg = small_config(target_layer_ids=(1, 2, 3, 4))
    ckpt = save_hf_checkpoint(tmp_path / "c", random_drafter(cfg, 5))
    with pytest.raises(CheckpointRefused, match=r"fc.weight has shape \[32, 160\] = 5 taps.*\[1, 2, 3, 4\]"):
        load_checkpoint(ckpt, TARGET)


def test_hidden_size_mismatch_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    with pytest.raises(CheckpointRefused, match="drafter hidden_size 32 != target 'small' hidden_size 48"):
        load_checkpoint(ckpt, small_target(hidden=48))


def test_layer_id_out_of_range_is_refused(tmp_path: Path) -> None:
    cfg = small_config(target_layer_ids=(1, 2, 6), num_target_layers=None)
    ckpt = save_hf_checkpoint(tmp_path / "c", random_drafter(cfg, 3))
    with pytest.raises(CheckpointRefused, match=r"\[1, 2, 6\].*ids \[6\] are outside the target.s 0\.\.5"):
        load_checkpoint(ckpt, TARGET)


def test_num_target_layers_mismatch_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    with pytest.raises(CheckpointRefused, match=r"built for a 6-layer target.*has 8 layers"):
        load_checkpoint(ckpt, small_target(num_layers=8))


def test_mask_token_outside_vocab_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path, small_config(mask_token_id=100))
    with pytest.raises(CheckpointRefused, match=r"mask_token_id 100 is outside the target vocab \[0, 100\)"):
        load_checkpoint(ckpt, TARGET)


@pytest.mark.parametrize(("num_target_layers", "expected"), [(64, [1, 16, 31, 46, 61]), (36, [1, 9, 17, 25, 33])])
def test_layer_ids_inferred_from_fc_width(tmp_path: Path, num_target_layers: int, expected: list[int]) -> None:
    cfg = small_config(target_layer_ids=None, num_target_layers=None)
    ckpt = save_hf_checkpoint(tmp_path / "c", random_drafter(cfg, 5))
    assert "target_layer_ids" not in json.loads((ckpt / "config.json").read_text())["dflash_config"]
    loaded = load_checkpoint(ckpt, small_target(num_layers=num_target_layers))
    assert (list(loaded.target_layer_ids), loaded.layer_ids_source) == (expected, "inferred")


def test_layer_ids_override_when_checkpoint_has_none(tmp_path: Path) -> None:
    cfg = small_config(target_layer_ids=None)
    ckpt = save_hf_checkpoint(tmp_path / "c", random_drafter(cfg, 3))
    loaded = load_checkpoint(ckpt, TARGET, LoadRequest(layer_ids=(0, 3, 5)))
    assert (loaded.target_layer_ids, loaded.layer_ids_source) == ((0, 3, 5), "override")


def test_hf_dir_without_weights_is_refused(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointRefused, match=r"none of model\.safetensors, .* and pytorch_model\.bin"):
        load_checkpoint(ckpt, TARGET)


def test_block_size_override_replaces_the_configs(tmp_path: Path) -> None:
    ckpt = _hf_dir(tmp_path)
    assert load_checkpoint(ckpt, TARGET).config.block_size == 5
    assert load_checkpoint(ckpt, TARGET, _block(16)).config.block_size == 16
    raw = json.loads((ckpt / "config.json").read_text())
    del raw["block_size"]
    _rewrite(ckpt, config=raw)
    with pytest.raises(CheckpointRefused, match="lacks 'block_size'"):
        load_checkpoint(ckpt, TARGET)
    assert load_checkpoint(ckpt, TARGET, _block(8)).config.block_size == 8


def _block(size: int) -> LoadRequest:
    return LoadRequest(options=DFlashOptions(block_size=size))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (Eagle3Options(steps=3), r"DFlash family: the options given \(steps\) are the EAGLE-3 family's"),
        (MtpOptions(), r"DFlash family: the options given are the MTP family's"),
    ],
)
def test_options_of_another_family_are_refused_naming_both(
    tmp_path: Path, options: Eagle3Options | MtpOptions, named: str
) -> None:
    with pytest.raises(CheckpointRefused, match=named):
        load_checkpoint(_hf_dir(tmp_path), TARGET, LoadRequest(options=options))


def test_a_spec_loads_with_its_config_file_layers_and_block(tmp_path: Path) -> None:
    cfg = small_config(target_layer_ids=None)
    drafter = random_drafter(cfg, 3)
    path = save_torch_checkpoint(tmp_path / "c.pt", drafter, global_step=5, epoch=0, include_config=False)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg.to_hf_dict("top_level")))
    spec = EvalSpec(config=str(config), target_layer_ids=[0, 3, 5], family_options=DFlashOptions(block_size=7))
    loaded = load_with_spec(path, TARGET, spec)
    assert (loaded.step, loaded.target_layer_ids, loaded.config.block_size) == (5, (0, 3, 5), 7)  # type: ignore[attr-defined]
    assert loaded.options == DFlashOptions(block_size=7)


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointRefused, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt", TARGET)


def test_a_specforge_dflash_config_is_dflash_though_it_names_a_draft_vocab(tmp_path: Path) -> None:
    """SpecForge 0.2 writes `draft_vocab_size` into DFlash configs too: the family is what the file says."""
    ckpt = _hf_dir(tmp_path)
    raw = json.loads((ckpt / "config.json").read_text())
    raw |= {"architectures": ["DFlashDraftModel"], "vocab_size": TARGET.vocab_size}
    _rewrite(ckpt, config=raw | {"draft_vocab_size": TARGET.vocab_size})
    loaded = load_checkpoint(ckpt, TARGET)
    assert (loaded.family, loaded.target_layer_ids) == ("dflash", (1, 2, 4))
    _rewrite(ckpt, config=raw | {"draft_vocab_size": TARGET.vocab_size // 2})  # a draft vocab it cannot decode with
    with pytest.raises(CheckpointRefused, match="a draft vocabulary is not implemented"):
        load_checkpoint(ckpt, TARGET)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"architectures": ["DSparkDraftModel"]}, "DSparkDraftModel drafters are not evaluated here"),
        ({"architectures": ["DominoDraftModel"]}, "DominoDraftModel drafters are not evaluated here"),
        ({"speculators_model_type": "mlp"}, "speculators_model_type 'mlp'"),
    ],
)
def test_other_draft_families_are_refused_by_name(tmp_path: Path, config: dict[str, Any], named: str) -> None:
    ckpt = _hf_dir(tmp_path)
    _rewrite(ckpt, config={**json.loads((ckpt / "config.json").read_text()), **config})
    with pytest.raises(CheckpointRefused, match=named):
        load_checkpoint(ckpt, TARGET)
