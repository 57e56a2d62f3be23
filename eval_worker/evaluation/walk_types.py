"""What every family's walk takes and gives: a prompt's features on the drafter's device, the work
counted while drafting, one prompt's walked rounds, and what a report says of a family's drafting."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from schemas.report import RoundTaus


@dataclass(frozen=True)
class PromptFeatures:
    """One prompt on the drafter's device: taps [T, K*H] and token ids [T] (prompt + response)."""

    taps: Tensor
    token_ids: list[int]
    prompt_len: int


@dataclass
class DraftCost:
    """Drafter work counted while walking."""

    drafted_blocks: int = 0  # drafter block forwards
    lm_head_rows: int = 0  # positions projected through lm_head
    draft_s: float = 0.0  # drafter forwards and lm_head projections (context k/v included)
    walk_s: float = 0.0  # building trees and walking them


@dataclass(frozen=True)
class Walked:
    """One prompt's rounds: the chain's accepted tokens per round, and the rounds of each tree (DDTree
    budgets for DFlash, EAGLE's dynamic trees by shape for EAGLE-3)."""

    chain: list[int]
    trees: dict[int, RoundTaus] = field(default_factory=dict)
    eagle_trees: dict[str, RoundTaus] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportFields:
    """What an EvalReport says of how a family drafted (None or empty where it does not apply)."""

    block_size: int | None
    mask_token_id: int | None
    steps: int | None
    draft_vocab_size: int | None
    tree_budgets: list[int]
    eagle_trees: list[str]
