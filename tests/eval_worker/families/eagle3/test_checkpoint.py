"""EAGLE-3 checkpoints: every layout loads strictly into the same drafter and asks for the same served
layers, layer-input ids are translated, what would compute wrong is refused (exit 3, checkpoint refused), and
what an engine never reads (`t2d`) or the user named inert loads, recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import read_raw
from eval_worker.errors import CheckpointRefused
from eval_worker.families.eagle3.checkpoint import describe_eagle3, load_eagle3
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from schemas.eval_spec import Eagle3Options
from schemas.model import ModelInfo
from testing.eagle3 import eagle3_config, random_eagle3, save_eagle3

# The same physical taps, decoder outputs [1, 5, 8] of a 12-layer target, as each layout writes them.
WRITTEN = {"eagle": None, "specforge": [1, 5, 8], "speculators": [2, 6, 9]}


def load_checkpoint(path: Path, info: ModelInfo, request: LoadRequest | None = None) -> LoadedCheckpoint:
    return load_eagle3(path, read_raw(path), info, request or LoadRequest())


@pytest.fixture
def info(eagle_target: Any) -> ModelInfo:
    c = eagle_target.config
    return ModelInfo(
        name="tiny12",
        fingerprint="fp12",
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings,
        dtype="float32",
        capture_layers=[],
    )


@pytest.fixture
def drafter(eagle_target: Any) -> Eagle3Drafter:
    d2t = torch.arange(100) * 3 - torch.arange(100)  # draft id d is target id 3d
    return random_eagle3(eagle3_config(eagle_target.config, draft_vocab_size=100), 3, seed=1, d2t=d2t)


@pytest.mark.parametrize("layout", list(WRITTEN))
@pytest.mark.parametrize("torch_file", [False, True], ids=["hf_dir", "torch_dict"])
def test_every_layout_loads_the_same_drafter_and_layers(
    tmp_path: Path, drafter: Eagle3Drafter, info: ModelInfo, layout: Any, torch_file: bool
) -> None:
    path = save_eagle3(
        tmp_path / layout, drafter, layout, layer_ids=WRITTEN[layout], global_step=7 if torch_file else None
    )
    loaded = load_checkpoint(path, info)
    assert (loaded.family, loaded.layout) == ("eagle3", layout)
    assert loaded.target_layer_ids == (1, 5, 8)
    ids = loaded.layer_ids
    assert ids.source == ("default" if layout == "eagle" else "checkpoint")
    assert ids.convention == ("decoder_output_0based" if layout == "specforge" else "layer_input")
    assert ids.checkpoint_ids == (tuple(WRITTEN[layout]) if WRITTEN[layout] else None)
    assert (loaded.options, loaded.inert_config_keys, loaded.warnings) == (Eagle3Options(), (), ())
    mine = loaded.drafter.state_dict()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(mine[name], tensor), name


def test_speculators_steps_and_flags_are_read(tmp_path: Path, eagle_target: Any, info: ModelInfo) -> None:
    cfg = eagle3_config(
        eagle_target.config, norm_before_residual=True, feature_norm="concat", feed_normed=True, qk_norm=True
    )
    path = save_eagle3(tmp_path / "s", random_eagle3(cfg, 3), "speculators", layer_ids=[2, 6, 9], steps=4)
    loaded = load_checkpoint(path, info)
    assert loaded.config == cfg.__class__(**{**cfg.__dict__, "speculative_tokens": 4})


def test_layer_convention_override_is_applied_and_recorded(
    tmp_path: Path, drafter: Eagle3Drafter, info: ModelInfo
) -> None:
    path = save_eagle3(tmp_path / "sf", drafter, "specforge", layer_ids=[2, 6, 9])
    assert load_checkpoint(path, info).target_layer_ids == (2, 6, 9)
    loaded = load_checkpoint(path, info, LoadRequest(options=Eagle3Options(layer_convention="layer_input")))
    assert loaded.target_layer_ids == (1, 5, 8)
    assert (loaded.layer_ids.convention, loaded.layer_ids.convention_source) == ("layer_input", "override")
    assert loaded.options == Eagle3Options(layer_convention="layer_input")


def _edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def _drop_tensor(path: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(path / "model.safetensors")
    del state[name]
    save_file(state, path / "model.safetensors")


REFUSALS: dict[str, tuple[str, str]] = {
    "ids do not match fc width": ("speculators", r"fc\.weight reads 192 features.*\[1, 5\] name 2 layers.*2 x 64"),
    "d2t missing": ("eagle", r"draft vocab \(100.*smaller than the target vocab \(512\).*no d2t"),
    "unknown flag": ("speculators", r"\['norm_before_everything'\] are not known"),
    "layer-input id 0": ("speculators", r"include 0, the embeddings"),
    "2-tap fc under a 3-tap convention": ("eagle", r"fc\.weight reads 128 features.*\[1, 5, 8\] name 3 layers"),
    "known flag, unimplemented value": ("eagle", r"rope_scaling=.*not implemented"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_name_what_is_wrong(
    tmp_path: Path, eagle_target: Any, info: ModelInfo, drafter: Eagle3Drafter, case: str
) -> None:
    layout, message = REFUSALS[case]
    written = {"ids do not match fc width": [2, 6], "layer-input id 0": [0, 6, 9]}.get(case, WRITTEN[layout])
    subject = random_eagle3(eagle3_config(eagle_target.config, draft_vocab_size=100), 2) if "2-tap" in case else drafter
    path = save_eagle3(tmp_path / "ckpt", subject, layout, layer_ids=written)
    if case == "d2t missing":
        _drop_tensor(path, "d2t")
    elif case == "unknown flag":
        _edit_config(path, norm_before_everything=True)
    elif case == "known flag, unimplemented value":
        _edit_config(path, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(CheckpointRefused, match=message):
        load_checkpoint(path, info)


def test_tied_word_embeddings_make_the_head_the_embedding(tmp_path: Path, eagle_target: Any, info: ModelInfo) -> None:
    """`tie_word_embeddings: true` is honoured: lm_head is embed_tokens (saved without its own copy, as HF does)."""
    full = random_eagle3(eagle3_config(eagle_target.config), 3, seed=2)  # draft vocab = the target's
    full.embed_tokens = torch.nn.Embedding(full.cfg.vocab_size, full.cfg.hidden_size)
    full.has_embed = True
    path = save_eagle3(tmp_path / "tied", full, "speculators", layer_ids=[2, 6, 9])
    _edit_config(path, tie_word_embeddings=True)
    _drop_tensor(path, "lm_head.weight")
    loaded = load_checkpoint(path, info)
    assert loaded.config.tied_lm_head  # type: ignore[union-attr]
    assert torch.equal(loaded.drafter.lm_head.weight, full.embed_tokens.weight)

    narrow = save_eagle3(
        tmp_path / "narrow",
        random_eagle3(eagle3_config(eagle_target.config, draft_vocab_size=100), 3),
        "speculators",
        layer_ids=[2, 6, 9],
    )
    _edit_config(narrow, tie_word_embeddings=True)
    with pytest.raises(CheckpointRefused, match=r"tie_word_embeddings is true.*draft vocab equal to the vocab"):
        load_checkpoint(narrow, info)


def _edit_layer_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    config["transformer_layer_config"] |= changes
    (path / "config.json").write_text(json.dumps(config))


def test_a_trainers_own_key_loads_when_named_inert(tmp_path: Path, drafter: Eagle3Drafter, info: ModelInfo) -> None:
    path = save_eagle3(tmp_path / "s", drafter, "speculators", layer_ids=WRITTEN["speculators"])
    _edit_config(path, wandb_id="run-7")
    with pytest.raises(CheckpointRefused, match=r"\['wandb_id'\] are not known.*--inert-config-keys wandb_id"):
        load_checkpoint(path, info)
    loaded = load_checkpoint(path, info, LoadRequest(inert_config_keys=frozenset({"wandb_id", "not_in_it"})))
    assert (loaded.inert_config_keys, loaded.warnings) == (("wandb_id",), ())  # a named key it lacks: nothing
    mine = loaded.drafter.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in drafter.state_dict().items())
    described = describe_eagle3(path, read_raw(path), LoadRequest(inert_config_keys=frozenset({"wandb_id"})))
    assert "inert keys         ['wandb_id'] (accepted as named)" in described


def test_a_nested_key_takes_the_same_set(tmp_path: Path, drafter: Eagle3Drafter, info: ModelInfo) -> None:
    """The set applies to every block: top level and `transformer_layer_config` alike, recorded once."""
    path = save_eagle3(tmp_path / "s", drafter, "speculators", layer_ids=WRITTEN["speculators"])
    _edit_layer_config(path, training_step=900, wandb_id="run-7")
    _edit_config(path, wandb_id="run-7")
    where = r"speculators transformer_layer_config config keys \['training_step'\]"
    with pytest.raises(CheckpointRefused, match=where + r".*--inert-config-keys training_step,wandb_id"):
        load_checkpoint(path, info, LoadRequest(inert_config_keys=frozenset({"wandb_id"})))
    named = frozenset({"training_step", "wandb_id"})
    assert load_checkpoint(path, info, LoadRequest(inert_config_keys=named)).inert_config_keys == (
        "training_step",
        "wandb_id",
    )


def test_a_known_key_named_inert_is_still_read(tmp_path: Path, eagle_target: Any, info: ModelInfo) -> None:
    """Naming a key inert never switches off one the loader reads: its math and refusals stay."""
    cfg = eagle3_config(eagle_target.config, feed_normed=True)
    path = save_eagle3(tmp_path / "s", random_eagle3(cfg, 3), "speculators", layer_ids=WRITTEN["speculators"])
    loaded = load_checkpoint(path, info, LoadRequest(inert_config_keys=frozenset({"norm_output", "torch_dtype"})))
    assert loaded.config == load_checkpoint(path, info).config  # norm_output still read: later steps feed norm(x)
    assert loaded.config.feed_normed  # type: ignore[attr-defined]
    assert loaded.inert_config_keys == ()
    (warning,) = loaded.warnings  # torch_dtype, inert to every loader, is not worth one
    assert "--inert-config-keys names ['norm_output'], which this loader knows: they are read as always" in warning
    _edit_layer_config(path, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(CheckpointRefused, match=r"rope_scaling=.*not implemented"):
        load_checkpoint(path, info, LoadRequest(inert_config_keys=frozenset({"rope_scaling"})))


def _set_t2d(path: Path, t2d: torch.Tensor) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(path / "model.safetensors")
    save_file({**state, "t2d": t2d}, path / "model.safetensors")


def test_a_t2d_that_disagrees_with_d2t_is_a_warning(tmp_path: Path, drafter: Eagle3Drafter, info: ModelInfo) -> None:
    """vLLM's EAGLE-3 load_weights skips t2d and drafts through d2t alone: so does this loader."""
    path = save_eagle3(tmp_path / "sf", drafter, "specforge", layer_ids=WRITTEN["specforge"])
    t2d = torch.zeros(512, dtype=torch.bool)
    t2d[:100] = True  # the first 100 target ids; d2t maps draft id d to 3d
    _set_t2d(path, t2d)
    loaded = load_checkpoint(path, info)
    (warning,) = loaded.warnings
    assert "t2d marks 100 target ids, d2t maps the 100 draft ids to 100" in warning
    assert "the first 1 (t2d True, d2t False)" in warning and "t2d is not read" in warning
    assert torch.equal(loaded.drafter.d2t, drafter.d2t)  # drafting follows d2t
    _set_t2d(path, torch.zeros(7, dtype=torch.int64))  # malformed: never read either, so a warning too
    (warning,) = load_checkpoint(path, info).warnings
    assert warning.startswith("t2d has shape [7] and dtype torch.int64, expected bool [512]")
