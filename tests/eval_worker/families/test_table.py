"""The family table decides which family a checkpoint is: each family says whether a config is its own,
and none or several is a refusal naming what the config says."""

from __future__ import annotations

import pytest

from eval_worker.errors import CheckpointRefused
from eval_worker.families import family_of


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"architectures": ["DFlashDraftModel"]}, "dflash"),
        ({"dflash_config": {"mask_token_id": 3}, "draft_vocab_size": 100}, "dflash"),  # SpecForge writes both
        ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
        ({"speculators_model_type": "eagle3"}, "eagle3"),
        ({"draft_vocab_size": 100}, "eagle3"),
    ],
)
def test_each_config_is_claimed_by_one_family(config: dict[str, object], family: str) -> None:
    assert family_of(config).name == family


def test_a_config_no_family_claims_is_refused_naming_what_it_says() -> None:
    with pytest.raises(
        CheckpointRefused, match=r"architectures \['Qwen3ForCausalLM'\]\) is read as a checkpoint of none"
    ):
        family_of({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64})
    with pytest.raises(CheckpointRefused, match="no architectures"):
        family_of({"hidden_size": 64})


def test_a_config_two_families_claim_is_refused_naming_both() -> None:
    with pytest.raises(CheckpointRefused, match="DFlash and EAGLE-3 of the families evaluated here"):
        family_of({"speculators_model_type": "eagle3", "dflash_config": {"mask_token_id": 3}})


def test_families_known_not_to_be_evaluated_are_refused_by_name() -> None:
    with pytest.raises(CheckpointRefused, match="DSparkDraftModel drafters are not evaluated here"):
        family_of({"architectures": ["DSparkDraftModel"]})
