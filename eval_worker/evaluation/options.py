"""How to evaluate: where and in which dtype the drafters run, batching, progress, how drafts are
sampled, and whether trees are walked at all. What is drafted (DDTree budgets, EAGLE trees, chain
steps) is each checkpoint's own: its family's options travel on the `LoadedCheckpoint`."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from schemas.sampling import DraftSampling


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate: where and in which dtype the drafter runs, batching, progress, drafting mode."""

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    group_tokens: int = 8192  # prompt tokens whose walks are drafted together (each block reads its own context)
    max_blocks: int = 64  # blocks per drafter forward
    progress: bool = True
    draft_sampling: DraftSampling = "greedy"  # probabilistic: also the expected tau under rejection sampling
    trees: bool = True  # False: the chain alone, whatever trees the checkpoint's options ask

    @property
    def chain_only(self) -> EvalOptions:
        """These options without trees: what a response sampled at T > 0 is walked with."""
        return replace(self, trees=False)
