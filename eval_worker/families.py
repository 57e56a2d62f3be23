"""The drafter families, one row each: how a checkpoint of the family is recognised, loaded and checked
against a target, how its drafts are walked, and what its report says of its drafting. Nothing
else tells the families apart, so a new family is a drafter (`drafters/`), a loader
(`checkpoints/`), a walk and its probabilistic drafting (`evaluation/`) and one row here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from eval_worker.checkpoints.dflash import check_dflash_fits, describe_dflash, is_dflash, load_dflash
from eval_worker.checkpoints.eagle3 import check_eagle3_fits, describe_eagle3, load_eagle3
from eval_worker.checkpoints.eagle3_layouts import is_eagle3
from eval_worker.checkpoints.loaded import Family, LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import RawCheckpoint
from eval_worker.evaluation.dflash_probabilistic import expected_dflash
from eval_worker.evaluation.dflash_walks import dflash_report_fields, walk_dflash
from eval_worker.evaluation.eagle3_probabilistic import expected_eagle3
from eval_worker.evaluation.eagle3_walks import eagle3_report_fields, walk_eagle3
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures, ReportFields, Walked
from schemas.model import ModelInfo
from schemas.report import ExpectedRounds
from schemas.sampling import SamplingParams

Walk = Callable[[LoadedCheckpoint, Sequence[PromptFeatures], Tensor, Tensor, EvalOptions, DraftCost], list[Walked]]
Expected = Callable[
    [
        LoadedCheckpoint,
        Sequence[PromptFeatures],
        Sequence[Tensor],
        Sequence[SamplingParams],
        Tensor,
        Tensor,
        tuple[Tensor, float],
        EvalOptions,
        DraftCost,
    ],
    list[ExpectedRounds],
]


@dataclass(frozen=True)
class DrafterFamily:
    """One family's part in each step of the data path."""

    name: Family
    title: str  # as people write it
    detect: Callable[[Mapping[str, Any]], bool]  # its config (CheckpointRefused: a family read by none)
    load: Callable[[Path, RawCheckpoint, ModelInfo, LoadRequest], LoadedCheckpoint]
    check_fits: Callable[[LoadedCheckpoint, ModelInfo], None]  # against a (possibly other) target's description
    walk: Walk  # a group of prompts' features, the target's embedding and head -> each prompt's rounds
    # ... and their last layers, sampling settings, the target's final norm -> each chain's expected rounds
    # under probabilistic drafting
    expected: Expected
    report_fields: Callable[[LoadedCheckpoint, EvalOptions], ReportFields]
    describe: Callable[[Path, RawCheckpoint, LoadRequest], list[str]]  # `eval-worker inspect`, no target needed
    # K speculative tokens per round, as an engine serves it -> (block size to draft, chain steps): `parity`
    engine_round: Callable[[int], tuple[int | None, int | None]]
    flags: frozenset[str]  # the evaluation options that apply to it alone


FAMILIES: dict[Family, DrafterFamily] = {
    f.name: f
    for f in (
        DrafterFamily(
            name="dflash",
            title="DFlash",
            detect=is_dflash,
            load=load_dflash,
            check_fits=check_dflash_fits,
            walk=walk_dflash,
            expected=expected_dflash,
            report_fields=dflash_report_fields,
            describe=describe_dflash,
            engine_round=lambda k: (k + 1, None),  # K drafts after the anchor: a block of K + 1
            flags=frozenset({"--tree-budget", "--block-size", "--mask-token-id"}),
        ),
        DrafterFamily(
            name="eagle3",
            title="EAGLE-3",
            detect=is_eagle3,
            load=load_eagle3,
            check_fits=check_eagle3_fits,
            walk=walk_eagle3,
            expected=expected_eagle3,
            report_fields=eagle3_report_fields,
            describe=describe_eagle3,
            engine_round=lambda k: (None, k),  # K chain steps
            flags=frozenset({"--eagle-tree", "--steps", "--layer-convention"}),
        ),
    )
}


def family_of(config: Mapping[str, Any]) -> DrafterFamily:
    """The one family whose config this is."""
    [found] = [f for f in FAMILIES.values() if f.detect(config)]
    return found
