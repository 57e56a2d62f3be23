from __future__ import annotations

import pytest

from eval_worker.checkpoints.layer_ids import default_layer_ids, resolve_layer_ids
from eval_worker.errors import CheckpointRefused


def test_dflash_formula() -> None:
    assert default_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_layer_ids(36, 1) == [18]


def test_checkpoint_ids_win_and_override_must_agree() -> None:
    got = resolve_layer_ids(checkpoint_ids=[2, 7], override=None, fc_shape=(8, 16), hidden_size=8, num_target_layers=10)
    assert (got.ids, got.source) == ((2, 7), "checkpoint")
    with pytest.raises(CheckpointRefused, match=r"override \[2, 8\] contradicts.*\[2, 7\]"):
        resolve_layer_ids(checkpoint_ids=[2, 7], override=[2, 8], fc_shape=(8, 16), hidden_size=8, num_target_layers=10)


def test_override_and_inferred_sources() -> None:
    got = resolve_layer_ids(checkpoint_ids=None, override=[0, 9], fc_shape=(8, 16), hidden_size=8, num_target_layers=10)
    assert (got.ids, got.source) == ((0, 9), "override")
    got = resolve_layer_ids(checkpoint_ids=None, override=None, fc_shape=(8, 40), hidden_size=8, num_target_layers=64)
    assert (got.ids, got.source) == ((1, 16, 31, 46, 61), "inferred")


def test_fc_width_not_a_multiple_of_hidden_is_refused() -> None:
    with pytest.raises(CheckpointRefused, match=r"fc.weight has shape \[8, 20\]"):
        resolve_layer_ids(checkpoint_ids=None, override=None, fc_shape=(8, 20), hidden_size=8, num_target_layers=10)
