"""DFlash loading reads its options from the request's DFlash block, and a key a trainer adds for itself
loads only when named inert, recorded; a key the loader reads, named inert, is still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import read_raw
from eval_worker.errors import CheckpointRefused
from eval_worker.families.dflash.checkpoint import describe_dflash, load_dflash
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.eval_spec import DFlashOptions, Eagle3Options
from testing.checkpoints import save_hf_checkpoint
from tests.eval_worker.helpers import random_drafter, small_config, small_target

TARGET = small_target()  # 6 layers, hidden 32, vocab 100


def _load(path: Path, request: LoadRequest | None = None) -> LoadedCheckpoint:
    return load_dflash(path, read_raw(path), TARGET, request or LoadRequest())


@pytest.fixture
def drafter() -> DFlashDrafter:
    return random_drafter(small_config(), 3)


def _saved(tmp_path: Path, drafter: DFlashDrafter, **extra: Any) -> Path:
    return save_hf_checkpoint(tmp_path / "hf", drafter, extra=extra)


def _same_weights(loaded: LoadedCheckpoint, drafter: DFlashDrafter) -> bool:
    mine = loaded.drafter.state_dict()
    return all(torch.equal(mine[k], v) for k, v in drafter.state_dict().items())


def test_options_come_from_the_dflash_block(tmp_path: Path, drafter: DFlashDrafter) -> None:
    path = _saved(tmp_path, drafter)
    plain = _load(path)
    assert (plain.options, plain.inert_config_keys, plain.warnings) == (DFlashOptions(), (), ())
    assert plain.config.block_size == 5  # type: ignore[attr-defined]
    options = DFlashOptions(block_size=8, tree_budgets=[4])
    loaded = _load(path, LoadRequest(options=options))
    assert (loaded.options, loaded.config.block_size) == (options, 8)  # type: ignore[attr-defined]
    with pytest.raises(CheckpointRefused, match="contradicts the config's mask_token_id 99"):
        _load(path, LoadRequest(options=DFlashOptions(mask_token_id=3)))
    with pytest.raises(CheckpointRefused, match="eagle3 options apply to eagle3 checkpoints, not DFlash"):
        _load(path, LoadRequest(options=Eagle3Options()))


def test_a_trainers_own_key_loads_when_named_inert(tmp_path: Path, drafter: DFlashDrafter) -> None:
    path = _saved(tmp_path, drafter, training_step=1200)
    message = (
        r"DFlash config keys \['training_step'\] are not known to this loader; a key that may change the "
        r"drafter's math is never ignored: if they do not, accept them with --inert-config-keys training_step"
    )
    with pytest.raises(CheckpointRefused, match=message):
        _load(path)
    loaded = _load(path, LoadRequest(inert_config_keys=frozenset({"training_step", "wandb_id"})))
    assert (loaded.inert_config_keys, loaded.warnings) == (("training_step",), ())  # wandb_id: absent, nothing
    assert loaded.config == small_config() and _same_weights(loaded, drafter)
    request = LoadRequest(inert_config_keys=frozenset({"training_step"}))
    assert "inert keys         ['training_step'] (accepted as named)" in describe_dflash(path, read_raw(path), request)


def test_a_nested_key_takes_the_same_set(tmp_path: Path, drafter: DFlashDrafter) -> None:
    path = _saved(tmp_path, drafter, training_step=1200)
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"] |= {"training_step": 1200, "run_name": "a"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointRefused, match=r"DFlash dflash_config config keys \['run_name'\]"):
        _load(path, LoadRequest(inert_config_keys=frozenset({"training_step"})))
    loaded = _load(path, LoadRequest(inert_config_keys=frozenset({"training_step", "run_name"})))
    assert loaded.inert_config_keys == ("run_name", "training_step")  # sorted, once each across blocks


def test_a_known_key_named_inert_is_still_read(tmp_path: Path, drafter: DFlashDrafter) -> None:
    """Naming block_size or a variant switch inert does not switch it off: the drafter's math is unchanged."""
    path = _saved(tmp_path, drafter)
    loaded = _load(path, LoadRequest(inert_config_keys=frozenset({"block_size", "mask_token_id"})))
    assert loaded.config == small_config() and _same_weights(loaded, drafter)
    assert loaded.inert_config_keys == ()
    (warning,) = loaded.warnings
    assert "names ['block_size', 'mask_token_id'], which this loader knows: they are read as always" in warning
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"]["shift_label"] = True
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointRefused, match=r"dflash_config\.shift_label=True is a DFlash variant"):
        _load(path, LoadRequest(inert_config_keys=frozenset({"shift_label"})))
