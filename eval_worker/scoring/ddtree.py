"""DDTree-B: a draft tree of at most B nodes (root excluded) from one DFlash forward.

Best-first on the float32 sum of log-softmax values along a path; every depth offers the same
top-min(B, vocab) candidates under any parent; ties go to the smaller tuple of ranks.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor


@dataclass(frozen=True)
class DraftTree:
    """Nodes in insertion order; node i has `tokens[i]`, `parents[i]` (-1 = root), `depths[i]` >= 1."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[tuple[int, ...], ...]

    def child(self, parent: int, token: int) -> int | None:
        """The child of `parent` holding `token`, or None."""
        for i, (p, t) in enumerate(zip(self.parents, self.tokens, strict=True)):
            if p == parent and t == token:
                return i
        return None


def build_tree(logprobs: Tensor, ids: Tensor, budget: int) -> DraftTree:
    """logprobs, ids [D, k] (per draft position, sorted by descending log-prob) -> tree of <= budget nodes.

    Uses the first min(budget, k) candidates of each position; the caller stores k >= min(budget, V)."""
    depth_max = logprobs.shape[0]
    width = min(budget, logprobs.shape[1])
    lp = logprobs[:, :width].detach().cpu().numpy().astype(np.float32)  # [D, width]
    tok = ids[:, :width].detach().cpu().tolist()
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    ranks_out: list[tuple[int, ...]] = []
    node_of: dict[tuple[int, ...], int] = {}
    # Heap entries: (-weight, ranks); ranks[d] = rank of the token chosen at depth d + 1.
    heap: list[tuple[float, tuple[int, ...]]] = []
    if depth_max and width and budget > 0:
        heap.append((-float(lp[0, 0]), (0,)))
    weights: dict[tuple[int, ...], np.float32] = {(0,): lp[0, 0]} if heap else {}
    while heap and len(tokens) < budget:
        _, ranks = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        node_of[ranks] = len(tokens)
        tokens.append(int(tok[depth - 1][rank]))
        parents.append(node_of[ranks[:-1]] if depth > 1 else -1)
        depths.append(depth)
        ranks_out.append(ranks)
        base = weights[ranks[:-1]] if depth > 1 else np.float32(0.0)
        if rank + 1 < width:
            sibling = (*ranks[:-1], rank + 1)
            weights[sibling] = np.float32(base + lp[depth - 1, rank + 1])
            heapq.heappush(heap, (-float(weights[sibling]), sibling))
        if depth < depth_max:
            first_child = (*ranks, 0)
            weights[first_child] = np.float32(weights[ranks] + lp[depth, 0])
            heapq.heappush(heap, (-float(weights[first_child]), first_child))
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(ranks_out))


def accepted_nodes(tree: DraftTree, reference: Sequence[int]) -> int:
    """Walk from the root following the child whose token is the target's greedy token; nodes matched."""
    node, matched = -1, 0
    for token in reference:
        nxt = tree.child(node, int(token))
        if nxt is None:
            break
        node, matched = nxt, matched + 1
    return matched
