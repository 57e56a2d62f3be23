"""The drafter families, one folder each (`dflash/`, `eagle3/`, `mtp/`: the model, its config layouts,
strict loading, walks and probabilistic drafting) and one row each in this table: how a checkpoint of the
family is recognised, loaded and checked against a target, how its drafts are walked, and what its
report says of its drafting (its block of `EvalReport.drafting`). A family's options are its block of
`EvalSpec.family_options` (`schemas.eval_spec`), resolved on the `LoadedCheckpoint` its loader returns.
Nothing else tells the families apart, and nothing in a family's folder imports this table: a new
family is a folder, an options block, a report block and a row."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import Family, LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import RawCheckpoint
from eval_worker.errors import CheckpointRefused
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, Walked
from eval_worker.families.dflash.checkpoint import check_dflash_fits, describe_dflash, is_dflash, load_dflash
from eval_worker.families.dflash.probabilistic import expected_dflash
from eval_worker.families.dflash.walks import dflash_report_fields, walk_dflash
from eval_worker.families.eagle3.checkpoint import check_eagle3_fits, describe_eagle3, load_eagle3
from eval_worker.families.eagle3.layouts import is_eagle3
from eval_worker.families.eagle3.probabilistic import expected_eagle3
from eval_worker.families.eagle3.walks import eagle3_report_fields, walk_eagle3
from eval_worker.families.mtp.checkpoint import check_mtp_fits, describe_mtp, is_mtp, load_mtp
from eval_worker.families.mtp.walks import expected_mtp, mtp_report_fields, walk_mtp
from schemas.eval_spec import AnyFamilyOptions, DFlashOptions, Eagle3Options, FamilyOptions, MtpOptions
from schemas.model import ModelInfo
from schemas.report import Drafting, ExpectedRounds
from schemas.sampling import SamplingParams

Walk = Callable[[LoadedCheckpoint, Sequence[PromptFeatures], DeviceHeads, EvalOptions, DraftCost], list[Walked]]
Expected = Callable[
    [LoadedCheckpoint, Sequence[PromptFeatures], Sequence[Tensor], Sequence[SamplingParams], DeviceHeads, EvalOptions,
     DraftCost],
    list[ExpectedRounds],
]  # fmt: skip


@dataclass(frozen=True)
class DrafterFamily:
    """One family's part in each step of the data path."""

    name: Family
    title: str  # as people write it
    options: type[AnyFamilyOptions]  # its block of `EvalSpec.family_options`
    detect: Callable[[Mapping[str, Any]], bool]  # its config (CheckpointRefused: a family read by none)
    load: Callable[[Path, RawCheckpoint, ModelInfo, LoadRequest], LoadedCheckpoint]
    check_fits: Callable[[LoadedCheckpoint, ModelInfo], None]  # against a (possibly other) target's description
    walk: Walk  # a group of prompts' features, the target's heads -> each prompt's rounds (trees and
    # steps: the checkpoint's `options`)
    # ... and their last layers, sampling settings -> each chain's expected rounds under probabilistic drafting
    expected: Expected
    report_fields: Callable[[LoadedCheckpoint], Drafting]  # the report's block of how it drafted
    describe: Callable[[Path, RawCheckpoint, LoadRequest], list[str]]  # `eval-worker inspect`, no target needed
    # K speculative tokens per round, as an engine serves it -> the options that draft so: `parity`
    engine_round: Callable[[int], FamilyOptions]


FAMILIES: dict[Family, DrafterFamily] = {
    f.name: f
    for f in (
        DrafterFamily(
            name="dflash",
            title="DFlash",
            options=DFlashOptions,
            detect=is_dflash,
            load=load_dflash,
            check_fits=check_dflash_fits,
            walk=walk_dflash,
            expected=expected_dflash,
            report_fields=dflash_report_fields,
            describe=describe_dflash,
            engine_round=lambda k: DFlashOptions(block_size=k + 1),  # K drafts after the anchor: a block of K + 1
        ),
        DrafterFamily(
            name="eagle3",
            title="EAGLE-3",
            options=Eagle3Options,
            detect=is_eagle3,
            load=load_eagle3,
            check_fits=check_eagle3_fits,
            walk=walk_eagle3,
            expected=expected_eagle3,
            report_fields=eagle3_report_fields,
            describe=describe_eagle3,
            engine_round=lambda k: Eagle3Options(steps=k),  # K chain steps
        ),
        DrafterFamily(
            name="mtp",
            title="MTP",
            options=MtpOptions,
            detect=is_mtp,
            load=load_mtp,
            check_fits=check_mtp_fits,
            walk=walk_mtp,
            expected=expected_mtp,
            report_fields=mtp_report_fields,
            describe=describe_mtp,
            engine_round=lambda k: MtpOptions(steps=k),  # K chain steps, the one head reused
        ),
    )
}


# Draft families SpecForge trains that this project does not evaluate: refused by name, never guessed.
OTHER_FAMILIES = ("dspark", "domino", "peagle")


def family_of(config: Mapping[str, Any]) -> DrafterFamily:
    """The one family that says a config is its own; CheckpointRefused when none or several do, and for
    the families known not to be evaluated here."""
    archs = [str(a) for a in config.get("architectures") or []]
    evaluated = ", ".join(f.title for f in FAMILIES.values())
    for arch in archs:
        if any(arch.lower().startswith(other) for other in OTHER_FAMILIES):
            raise CheckpointRefused(f"architectures {archs}: {arch} drafters are not evaluated here ({evaluated})")
    claimed = [f for f in FAMILIES.values() if f.detect(config)]
    if len(claimed) != 1:
        said = f"architectures {archs}" if archs else "no architectures"
        which = " and ".join(f.title for f in claimed) if claimed else "none"
        raise CheckpointRefused(
            f"the drafter config ({said}) is read as a checkpoint of {which} of the families evaluated here "
            f"({evaluated}): its config must say which it is (architectures, or the family's own block)"
        )
    return claimed[0]
