"""How to evaluate: trees and chain length, where and in which dtype the drafters run, batching."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from schemas.eval_spec import EvalSpec
from schemas.sampling import DraftSampling
from schemas.trees import EagleTreeShape


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate: trees and chain length, where and in which dtype the drafter runs, batching, progress."""

    tree_budgets: tuple[int, ...] = ()  # DDTree budgets (DFlash)
    eagle_trees: tuple[EagleTreeShape, ...] = ()  # EAGLE trees (EAGLE-3)
    steps: int | None = None  # EAGLE-3 chain drafts per round (None: the checkpoint's, else 5)
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    group_tokens: int = 8192  # prompt tokens whose walks are drafted together (each block reads its own context)
    max_blocks: int = 64  # blocks per drafter forward
    progress: bool = True
    draft_sampling: DraftSampling = "greedy"  # probabilistic: also the expected tau under rejection sampling

    def __post_init__(self) -> None:  # checked as the CLI and POST /jobs check them (ValidationError)
        EvalSpec(
            tree_budgets=list(self.tree_budgets),
            steps=self.steps,
            eagle_trees=[t.key for t in self.eagle_trees],
            draft_sampling=self.draft_sampling,
        )

    @property
    def chain_only(self) -> EvalOptions:
        """These options without trees: what a response sampled at T > 0 is walked with."""
        return replace(self, tree_budgets=(), eagle_trees=())
