"""Chain and tree walks with fake drafters whose drafts are known exactly."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from eval_worker.scoring.acceptance import chain_accept_length, chain_round_taus, tree_round_taus
from testing.all_anchor import score_prompt

TOKENS = [5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # prompt of 3 + 10 response tokens
PROMPT_LEN, BLOCK = 3, 4
NOT_A_TOKEN = -1


class OracleDrafts:
    """Drafts the reference continuation; as a tree, rank 0 of every position is the reference token."""

    def __init__(self, tokens: Sequence[int], block_size: int, k: int = 4) -> None:
        self.tokens, self.block_size, self.k = list(tokens), block_size, k

    def greedy_drafts(self, s: int) -> list[int]:
        ahead = self.tokens[s + 1 : s + self.block_size]
        return ahead + [NOT_A_TOKEN] * (self.block_size - 1 - len(ahead))

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        ids = torch.tensor([[t, 1000, 1001, 1002][: self.k] for t in self.greedy_drafts(s)])
        logprobs = torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1][: self.k])).expand(ids.shape[0], -1)
        return logprobs, ids


class NeverRight(OracleDrafts):
    def greedy_drafts(self, s: int) -> list[int]:
        return [NOT_A_TOKEN] * (self.block_size - 1)


class RightTwiceThenWrong(OracleDrafts):
    def greedy_drafts(self, s: int) -> list[int]:
        good = super().greedy_drafts(s)
        return good[:2] + [NOT_A_TOKEN] * (self.block_size - 3)


def test_oracle_scores_block_size_per_full_round() -> None:
    taus = chain_round_taus(TOKENS, PROMPT_LEN, BLOCK, OracleDrafts(TOKENS, BLOCK))
    # s = 3, 7 are full rounds; s = 11 has one reference token left (a = 1, plus the bonus).
    assert taus == [4, 4, 2]


def test_never_right_scores_one_every_round() -> None:
    taus = chain_round_taus(TOKENS, PROMPT_LEN, BLOCK, NeverRight(TOKENS, BLOCK))
    assert taus == [1] * (len(TOKENS) - 1 - PROMPT_LEN)


def test_partial_acceptance_advances_by_a_plus_one() -> None:
    taus = chain_round_taus(TOKENS, PROMPT_LEN, BLOCK, RightTwiceThenWrong(TOKENS, BLOCK))
    assert taus == [3, 3, 3]  # s = 3, 6, 9; s = 12 = T - 1 ends the walk


def test_walk_stops_before_the_last_token() -> None:
    assert chain_round_taus(TOKENS[:4], PROMPT_LEN, BLOCK, OracleDrafts(TOKENS, BLOCK)) == []
    assert chain_round_taus(TOKENS[:5], PROMPT_LEN, BLOCK, OracleDrafts(TOKENS, BLOCK)) == [2]


def test_chain_accept_length_only_compares_the_remaining_tokens() -> None:
    assert chain_accept_length([1, 2, 3], [1, 2]) == 2
    assert chain_accept_length([1, 9, 3], [1, 2, 3]) == 1
    assert chain_accept_length([], [1]) == 0


def test_tree_oracle_and_chain_oracle_agree() -> None:
    for budget in (3, 8):
        assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, OracleDrafts(TOKENS, BLOCK), budget) == [4, 4, 2]
    # Budget 1 is a single node (the root does not count): at most one token plus the bonus.
    assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, OracleDrafts(TOKENS, BLOCK), 1) == [2] * 5


def test_tree_recovers_a_rank_one_token_the_chain_misses() -> None:
    class SecondBest(OracleDrafts):
        """The reference token is rank 1 at the first draft position, rank 0 after."""

        def top(self, s: int) -> tuple[Tensor, Tensor]:
            logprobs, ids = super().top(s)
            ids = ids.clone()
            ids[0, [0, 1]] = ids[0, [1, 0]]
            return logprobs, ids

    drafts = SecondBest(TOKENS, BLOCK)
    assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, drafts, 1) == [1] * 9
    # Pops: 1000 (.7), 1000-t (.49), 1000-t-t (.343), t (.1), 1001 (.1), 1002 (.1), then four
    # paths of .07 in rank-tuple order: 1000-1000 (0,1), 1000-1001 (0,2), 1000-1002 (0,3), t-t (1,0).
    assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, drafts, 5) == [2] * 5
    assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, drafts, 9) == [2] * 5
    assert tree_round_taus(TOKENS, PROMPT_LEN, BLOCK, drafts, 10) == [3, 3, 3]


def test_score_prompt_reports_chain_and_trees() -> None:
    result = score_prompt("p", OracleDrafts(TOKENS, BLOCK), TOKENS, PROMPT_LEN, BLOCK, [2, 4])
    assert result.chain.round_taus == [4, 4, 2]
    assert result.chain.mean == 10 / 3
    assert set(result.trees) == {2, 4}
    assert result.trees[4].round_taus == [4, 4, 2]
    assert (result.num_tokens, result.prompt_len) == (13, 3)
