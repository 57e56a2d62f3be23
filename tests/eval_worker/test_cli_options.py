"""The family options of the command line fill the block of the family they are for: the checkpoint's
for `evaluate` (and `submit` where it reads the checkpoint here), else --family's, else the one family
every flag fits; a flag is never ignored."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from transformers import AutoConfig

from eval_worker.cli import _check_spec, _parser
from eval_worker.cli_options import FamilyFlags, eval_spec, job_options
from eval_worker.commands import _job_spec
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions
from testing.eagle3 import eagle3_config, random_eagle3, save_eagle3


def _flags(*argv: str) -> tuple[FamilyFlags, argparse.Namespace]:
    p = argparse.ArgumentParser()
    job_options(p)
    args = p.parse_args(list(argv))
    return FamilyFlags.of(args), args


def test_each_family_gets_the_flags_it_reads() -> None:
    flags, _ = _flags("--tree-budget", "4", "--steps", "3", "--mask-token-id", "7")
    assert flags.blocks() == {
        "dflash": DFlashOptions(tree_budgets=[4], mask_token_id=7),
        "eagle3": Eagle3Options(steps=3),
        "mtp": MtpOptions(steps=3),
    }
    flags.check_used({"dflash", "mtp"})
    with pytest.raises(ValueError, match="--tree-budget applies to DFlash drafters; none of these checkpoints is one"):
        flags.check_used({"eagle3"})
    assert _flags()[0].blocks() == {"dflash": None, "eagle3": None, "mtp": None}


def test_family_fills_its_block_for_every_checkpoint() -> None:
    flags, _ = _flags("--family", "mtp", "--steps", "2")
    assert flags.block() == MtpOptions(steps=2)
    assert list(flags.blocks().values()) == [MtpOptions(steps=2)] * 3  # loading refuses another family's
    assert _flags("--family", "eagle3")[0].block() == Eagle3Options()


def test_without_a_checkpoint_the_flags_must_say_their_family() -> None:
    assert _flags("--eagle-tree", "4, 3, 16", "--steps", "3")[0].block() == Eagle3Options(
        steps=3, eagle_trees=["4,3,16"]
    )
    assert _flags("--block-size", "8")[0].block() == DFlashOptions(block_size=8)
    assert _flags()[0].block() is None
    with pytest.raises(ValueError, match="--steps applies to EAGLE-3 and MTP drafters: say which with --family"):
        _flags("--steps", "3")[0].block()


def test_the_rest_of_the_spec_and_its_config_path() -> None:
    _, args = _flags("--target-layer-ids", "1,3", "--draft-sampling", "probabilistic", "--inert-config-keys", "a, b")
    args.sets = ["s"]
    assert eval_spec(args, DFlashOptions(), config="cfg.json") == EvalSpec(
        target_layer_ids=[1, 3],
        sets=["s"],
        draft_sampling="probabilistic",
        config="cfg.json",
        inert_config_keys=["a", "b"],
        family_options=DFlashOptions(),
    )


def _submitted(*argv: str) -> EvalSpec:
    """The spec `eval-worker submit` sends with these arguments, checked as before any server is asked."""
    args = _parser().parse_args(["submit", *argv])
    _check_spec(args)
    return _job_spec(args, None)


def test_submit_fills_the_block_of_the_family_the_checkpoint_reads_here(tiny_target: Path, tmp_path: Path) -> None:
    drafter = random_eagle3(eagle3_config(AutoConfig.from_pretrained(tiny_target)), 3)
    torch_file = save_eagle3(tmp_path / "step_4.pt", drafter, "specforge", layer_ids=[1, 3, 5], global_step=4)
    hf_dir = save_eagle3(tmp_path / "hf", drafter, "speculators", layer_ids=[1, 3, 5])
    for checkpoint in (torch_file, hf_dir):  # --steps fits EAGLE-3 and MTP: the checkpoint says which, as in evaluate
        assert _submitted(str(checkpoint), "--steps", "4").family_options == Eagle3Options(steps=4)
    assert _submitted(str(hf_dir), "--family", "mtp", "--steps", "4").family_options == MtpOptions(steps=4)
    with pytest.raises(ValueError, match="--steps applies to EAGLE-3 and MTP drafters: say which with --family"):
        _submitted(str(tmp_path / "a-path-only-the-server-sees.pt"), "--steps", "4")
