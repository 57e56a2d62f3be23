"""A job's options travel as one spec: bodies of older clients (flat family fields) mean the same spec as
the family block, and a job's state keeps the flat copies older clients read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions, families_reading
from schemas.jobs import JobState, JobSubmit


def _state(**fields: Any) -> dict[str, Any]:
    base = {
        "job_id": "j",
        "status": "queued",
        "checkpoint": "/r/a.pt",
        "checkpoint_relative": "a.pt",
        "prompts": "all",
        "target_fingerprint": None,
        "attempts": 0,
        "max_attempts": 3,
        "worker": None,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "started_at": None,
        "finished_at": None,
        "lease_expires_at": None,
        "error": None,
    }
    return base | fields


def test_a_flat_body_is_the_same_job_as_its_block() -> None:
    flat = JobSubmit(checkpoint="a.pt", tree_budgets=[4, 8], block_size=6, mask_token_id=3, sets=["a"])
    block = {"family": "dflash", "tree_budgets": [4, 8], "block_size": 6, "mask_token_id": 3}
    assert flat == JobSubmit.model_validate({"checkpoint": "a.pt", "sets": ["a"], "family_options": block})
    assert flat.eval_spec() == EvalSpec(sets=["a"], family_options=DFlashOptions.model_validate(block))
    assert JobSubmit(checkpoint="a.pt", steps=2).family_options == Eagle3Options(steps=2)  # as before: EAGLE-3's


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tree_budgets": [4], "steps": 2}, "belong to different drafter families"),
        ({"steps": 2, "family_options": {"family": "mtp"}}, "inside family_options, not beside it"),
        ({"family_options": {"family": "mtp", "tree_budgets": [4]}}, "tree_budgets"),
    ],
)
def test_options_of_two_families_are_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JobSubmit.model_validate({"checkpoint": "a.pt", **body})


def test_a_job_state_keeps_the_flat_copies_of_its_spec() -> None:
    spec = EvalSpec(target_layer_ids=[1, 3], family_options=Eagle3Options(steps=2, eagle_trees=["4,3,16"]))
    state = JobState.model_validate(_state(spec=spec, steps=99))  # the copies are always the spec's
    assert (state.steps, state.eagle_trees, state.tree_budgets, state.target_layer_ids) == (2, ["4,3,16"], [], [1, 3])
    mtp = JobState.model_validate(_state(spec=EvalSpec(family_options=MtpOptions(steps=3))))
    assert (mtp.steps, mtp.block_size) == (3, None)


def test_a_state_from_a_server_before_the_spec_gets_the_spec_its_fields_mean() -> None:
    old = JobState.model_validate(_state(tree_budgets=[8], block_size=4, target_layer_ids=None, sets=["a"]))
    assert old.spec == EvalSpec(sets=["a"], family_options=DFlashOptions(tree_budgets=[8], block_size=4))


def test_the_family_of_each_field_and_which_blocks_ask_for_trees() -> None:
    assert families_reading("steps") == ["eagle3", "mtp"]
    assert families_reading("mask_token_id") == ["dflash"] and families_reading("family") == []
    assert [EvalSpec(family_options=b).asks_trees for b in (DFlashOptions(tree_budgets=[2]), MtpOptions())] == [
        True,
        False,
    ]
