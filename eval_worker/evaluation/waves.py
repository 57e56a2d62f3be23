"""Rounds walked in waves, as the EAGLE-3 and MTP walks drive them: every walk is one prompt's sequence
of rounds of one kind (the chain, or a tree shape); wave r drafts round r of every active walk, each
kind's rounds stacked at most `max_rounds` to a forward, and a round that accepts a drafts moves its
walk from anchor s to s + a + 1. (DFlash drives its own waves: walks standing on one anchor share a
drafted block there.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures

CHAIN = "chain"  # the kind of the greedy chain's walks; tree walks are keyed by their shape


@dataclass
class RoundWalk:
    """One prompt's walk of one kind: its anchor s and the taus of the rounds so far."""

    prompt: int
    s: int
    kind: str = CHAIN
    taus: list[int] = field(default_factory=list)

    def reference(self, prompts: Sequence[PromptFeatures], length: int) -> list[int]:
        """The target's tokens after the anchor, at most `length` of them."""
        ids = prompts[self.prompt].token_ids
        return ids[self.s + 1 : min(self.s + 1 + length, len(ids))]


DraftRounds = Callable[[list[RoundWalk]], list[int]]  # rounds at the walks' anchors -> accepted drafts of each


def walk_in_waves(
    prompts: Sequence[PromptFeatures],
    walks: Sequence[RoundWalk],
    rounds: Mapping[str, DraftRounds],
    max_rounds: int,
    cost: DraftCost,
) -> None:
    """Walk every walk to its prompt's end, drafting each kind's rounds with `rounds[kind]` (timed and
    counted in `cost`)."""
    while active := [w for w in walks if w.s < len(prompts[w.prompt].token_ids) - 1]:
        for kind, draft_rounds in rounds.items():
            mine = [w for w in active if w.kind == kind]
            for lo in range(0, len(mine), max_rounds):
                part = mine[lo : lo + max_rounds]
                started = time.perf_counter()
                accepted = draft_rounds(part)
                cost.draft_s += time.perf_counter() - started
                cost.drafted(len(part))
                for w, a in zip(part, accepted, strict=True):
                    w.taus.append(a + 1)
                    w.s += a + 1
