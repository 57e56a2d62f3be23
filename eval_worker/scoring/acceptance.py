"""Greedy acceptance length (tau) walks over one cached sequence, for chains and DDTree.

A round at anchor s scores tau = a + 1 (the target's bonus token counts), a = drafted tokens that
match the target's greedy tokens t[s+1..] (only the reference tokens that remain are compared);
the walk starts at s = prompt_len and stops once s >= T - 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from torch import Tensor

from eval_worker.scoring.ddtree import accepted_nodes, build_tree


class DraftLookup(Protocol):
    """Per-anchor drafts: greedy chain d_1..d_{B-1}, and top-k log-probs / ids [B-1, k] for trees."""

    def greedy_drafts(self, s: int) -> Sequence[int]:
        """The greedy chain drafted at anchor s."""
        ...

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        """Top-k log-probs and ids [B-1, k] drafted at anchor s."""
        ...


def chain_accept_length(drafts: Sequence[int], reference: Sequence[int]) -> int:
    """Longest prefix of `drafts` equal to `reference` (the remaining greedy tokens)."""
    a = 0
    for d, t in zip(drafts, reference, strict=False):
        if d != t:
            break
        a += 1
    return a


def _walk(
    token_ids: Sequence[int], prompt_len: int, block_size: int, accept: Callable[[int, Sequence[int]], int]
) -> list[int]:
    """`accept(s, remaining reference tokens)` -> a, for each round of the walk."""
    taus: list[int] = []
    total, s = len(token_ids), prompt_len
    while s < total - 1:
        a = accept(s, token_ids[s + 1 : min(s + block_size, total)])
        taus.append(a + 1)
        s += a + 1
    return taus


def chain_round_taus(token_ids: Sequence[int], prompt_len: int, block_size: int, drafts: DraftLookup) -> list[int]:
    """Per-round tau of greedy chain drafting over prompt + target-greedy response `token_ids`."""
    return _walk(token_ids, prompt_len, block_size, lambda s, ref: chain_accept_length(drafts.greedy_drafts(s), ref))


def tree_round_taus(
    token_ids: Sequence[int], prompt_len: int, block_size: int, drafts: DraftLookup, budget: int
) -> list[int]:
    """Per-round tau of DDTree-`budget` over the same walk."""

    def accept(s: int, reference: Sequence[int]) -> int:
        logprobs, ids = drafts.top(s)
        return accepted_nodes(build_tree(logprobs, ids, budget), reference)

    return _walk(token_ids, prompt_len, block_size, accept)
