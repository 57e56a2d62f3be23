from __future__ import annotations

from typing import Any

import pytest

from eval_worker.errors import CheckpointRefused
from eval_worker.families.dflash.config import DFlashConfig
from tests.eval_worker.helpers import small_config


@pytest.mark.parametrize("layout", ["published", "top_level", "block_in_dflash_config"])
def test_every_layout_round_trips(layout: Any) -> None:
    cfg = small_config()
    assert DFlashConfig.from_hf_dict(cfg.to_hf_dict(layout)) == cfg


def test_rope_parameters_form_and_head_dim_default() -> None:
    raw = small_config().to_hf_dict()
    del raw["rope_theta"], raw["head_dim"]
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    cfg = DFlashConfig.from_hf_dict(raw)
    assert (cfg.rope_theta, cfg.head_dim) == (5e5, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mask_token_id": 7}, "mask_token_id=7 at the top level but 99 in dflash_config"),
        ({"dflash_config": {}}, "names no mask_token_id.*pass --mask-token-id"),
        ({"block_size": None}, "lacks 'block_size'"),
        ({"rope_theta": None}, "neither rope_theta"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "RoPE type 'yarn'"),
        ({"attention_bias": True}, "biases"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"num_key_value_heads": 3}, "not a multiple"),
    ],
)
def test_bad_configs_are_refused(change: dict[str, Any], message: str) -> None:
    raw = small_config().to_hf_dict() | change
    with pytest.raises(CheckpointRefused, match=message):
        DFlashConfig.from_hf_dict(raw)
