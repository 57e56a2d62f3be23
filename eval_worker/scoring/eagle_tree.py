"""EAGLE's dynamic draft tree (`topK_genrate` in SafeAILab/EAGLE), its shape options and its greedy walk.

Drafting gathers, per round, the cumulative log-probs and target ids of every candidate it scored:
`top_k` first-level candidates, then `top_k * top_k` per expansion (`depth` expansions, so paths are up
to depth + 1 drafts long), and for each group of `top_k` candidates the flat index + 1 of the node it
expanded (0 = the root). The tree keeps the best `total_tokens - 1` candidates (plus the root), each
attached to its parent by the same `searchsorted` EAGLE uses. Greedy verification follows the child
whose token is the target's greedy token; the round scores the matched nodes + 1.

Ties (confident drafters put exactly 0.0 log-prob on their top token, so a child can score the same
as its parent) go to the earlier candidate: every top-k here is a stable descending sort. That keeps a
node's parent ahead of it, and makes the tree the same however the candidates were batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from schemas.trees import EagleTreeShape

__all__ = ["EagleTree", "EagleTreeShape", "select_tree", "stable_topk"]


def stable_topk(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest along the last dim and their indices; ties go to the lower index."""
    ordered, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return ordered[..., :k], order[..., :k]


@dataclass(frozen=True)
class EagleTree:
    """Node i+1 carries `tokens[i]` and hangs under node `parents[i]` (node 0 is the root)."""

    tokens: list[int]
    parents: list[int]

    def accepted(self, reference: Sequence[int]) -> int:
        """Nodes matched walking from the root along the target's greedy tokens `reference`."""
        children: dict[tuple[int, int], int] = {}
        for i, (parent, token) in enumerate(zip(self.parents, self.tokens, strict=True)):
            children.setdefault((parent, token), i + 1)
        node = a = 0
        while a < len(reference) and (node, reference[a]) in children:
            node = children[(node, reference[a])]
            a += 1
        return a


def select_tree(scores: Tensor, tokens: Tensor, parents: Tensor, shape: EagleTreeShape) -> EagleTree:
    """One round's candidates -> its tree: scores and tokens [top_k + depth * top_k^2], parents
    [1 + depth * top_k] (for each group of top_k candidates, its parent's flat index + 1)."""
    chosen = stable_topk(scores, shape.total_tokens - 1)[1].sort().values
    draft_parents = parents[chosen // shape.top_k]
    where = torch.searchsorted(chosen, draft_parents - 1)  # the parent's place among the chosen
    where[draft_parents == 0] = -1
    return EagleTree(tokens[chosen].tolist(), (where + 1).tolist())
