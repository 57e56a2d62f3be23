"""DDTree on hand-made distributions (log-probs given directly, sorted per depth)."""

from __future__ import annotations

import math

import torch

from eval_worker.scoring.ddtree import accepted_nodes, build_tree


def _dist(rows: list[list[tuple[int, float]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """rows[d] = [(token, prob), ...] sorted by prob -> (log-probs, ids) [D, k]."""
    lp = torch.tensor([[math.log(p) for _, p in row] for row in rows], dtype=torch.float32)
    ids = torch.tensor([[t for t, _ in row] for row in rows])
    return lp, ids


def test_budget_excludes_root_and_is_best_first() -> None:
    lp, ids = _dist([[(10, 0.6), (11, 0.3), (12, 0.1)], [(20, 0.9), (21, 0.05), (22, 0.05)]])
    tree = build_tree(lp, ids, budget=3)
    assert len(tree.tokens) == 3
    # 10 (0.6), then 10->20 (0.54), then 11 (0.3); 11->20 (0.27) would be next.
    assert tree.tokens == (10, 20, 11)
    assert tree.parents == (-1, 0, -1)
    assert tree.depths == (1, 2, 1)
    assert build_tree(lp, ids, budget=4).tokens == (10, 20, 11, 20)


def test_ties_go_to_the_smaller_rank_tuple() -> None:
    # Every path of depth 1 and 2 weighs the same at a given depth: order follows the rank tuples.
    lp, ids = _dist([[(1, 0.5), (2, 0.5)], [(3, 0.5), (4, 0.5)]])
    tree = build_tree(lp, ids, budget=6)
    assert tree.ranks == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert tree.tokens == (1, 2, 3, 4, 3, 4)


def test_depth_is_limited_to_the_draft_positions() -> None:
    lp, ids = _dist([[(1, 0.99), (2, 0.01)], [(3, 0.99), (4, 0.01)], [(5, 0.99), (6, 0.01)]])
    tree = build_tree(lp, ids, budget=10)
    assert max(tree.depths) == 3
    assert len(tree.tokens) == 10  # the budget caps the 14-node full binary tree
    full = build_tree(lp, ids, budget=100)  # the whole tree, and nothing deeper than 3
    assert len(full.tokens) == 2 + 4 + 8
    assert max(full.depths) == 3


def test_candidates_per_depth_are_top_min_budget() -> None:
    lp, ids = _dist([[(1, 0.4), (2, 0.3), (3, 0.2), (4, 0.1)]])
    assert build_tree(lp, ids, budget=2).tokens == (1, 2)
    assert build_tree(lp, ids, budget=0).tokens == ()


def test_verification_follows_the_target_tokens() -> None:
    lp, ids = _dist([[(10, 0.6), (11, 0.4)], [(20, 0.7), (21, 0.3)], [(30, 0.8), (31, 0.2)]])
    tree = build_tree(lp, ids, budget=8)
    # Pop order: 10, 10-20, 11, 10-20-30, 11-20, 11-20-30, 10-21, 10-21-30.
    assert tree.tokens == (10, 20, 11, 30, 20, 30, 21, 30)
    assert accepted_nodes(tree, [11, 21, 31]) == 1  # 11-21 is not in the tree
    assert accepted_nodes(tree, [11, 20, 30]) == 3
    assert accepted_nodes(tree, [10, 21, 30]) == 3
    assert accepted_nodes(tree, [10, 20, 30]) == 3
    assert accepted_nodes(tree, [12, 20, 30]) == 0
    assert accepted_nodes(tree, [10, 99, 30]) == 1
    assert accepted_nodes(tree, [10]) == 1  # only the remaining reference tokens are compared
