"""The key check every loader runs: unknown keys refused by name with the flag that accepts them, named
keys accepted and reported, a named key the loader knows still its own."""

from __future__ import annotations

import pytest

from eval_worker.checkpoints.config_keys import INERT, KeysAccepted, check_keys, inert_lines
from eval_worker.errors import CheckpointRefused

KNOWN = INERT | {"hidden_size", "block_size"}


def test_unknown_keys_are_refused_naming_the_flag_that_accepts_them() -> None:
    raw = {"hidden_size": 32, "wandb_id": "x", "training_step": 9}
    with pytest.raises(CheckpointRefused) as refused:
        check_keys(raw, KNOWN, "DFlash")
    assert str(refused.value) == (
        "DFlash config keys ['training_step', 'wandb_id'] are not known to this loader; a key that may change "
        "the drafter's math is never ignored: if they do not, accept them with --inert-config-keys "
        "training_step,wandb_id (inert_config_keys in a job)"
    )
    # the flag named is the whole value to pass: the keys already named and the ones still refused
    with pytest.raises(CheckpointRefused, match=r"\['wandb_id'\].*--inert-config-keys run,training_step,wandb_id"):
        check_keys(raw, KNOWN, "DFlash", frozenset({"training_step", "run"}))


def test_named_keys_are_accepted_and_reported() -> None:
    raw = {"hidden_size": 32, "wandb_id": "x", "training_step": 9}
    accepted = check_keys(raw, KNOWN, "DFlash", frozenset({"wandb_id", "training_step", "absent"}))
    assert accepted == KeysAccepted(("training_step", "wandb_id"), ())  # a named key it lacks: nothing
    assert accepted.warnings == ()
    assert inert_lines(accepted) == ["inert keys         ['training_step', 'wandb_id'] (accepted as named)"]
    assert check_keys(raw | {"x": 1}, KNOWN | {"x"}, "DFlash", frozenset({"wandb_id", "training_step"})) == accepted


def test_a_named_key_the_loader_knows_is_still_its_own() -> None:
    raw = {"hidden_size": 32, "block_size": 4, "torch_dtype": "float32"}
    accepted = check_keys(raw, KNOWN, "DFlash", frozenset({"block_size", "torch_dtype"}))
    assert accepted == KeysAccepted((), ("block_size",))  # torch_dtype: inert to every loader already
    (warning,) = accepted.warnings
    assert warning.startswith("--inert-config-keys names ['block_size'], which this loader knows")
    assert inert_lines(accepted) == [f"warning            {warning}"]


def test_blocks_merge_sorted_and_once() -> None:
    top = KeysAccepted(("wandb_id",), ("block_size",))
    nested = KeysAccepted(("training_step", "wandb_id"), ())
    assert top | nested == KeysAccepted(("training_step", "wandb_id"), ("block_size",))
