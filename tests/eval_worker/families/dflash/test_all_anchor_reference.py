from __future__ import annotations

import pytest
import torch

from eval_worker.families.dflash.drafter import draft_block
from testing.all_anchor import draft_anchors
from tests.eval_worker.helpers import random_drafter, small_config


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_batched_drafts_equal_per_round_drafts(chunk_size: int) -> None:
    cfg = small_config()
    drafter = random_drafter(cfg, 3)
    torch.manual_seed(3)
    t = 23
    taps, embed, head = torch.randn(t, 96), torch.randn(100, 32), torch.randn(100, 32)
    token_ids = torch.randint(0, 99, (t,))
    anchors = [1, 2, 7, 8, 9, 15, 21]  # unsorted chunks mix short and long contexts
    drafts = draft_anchors(drafter, taps, token_ids, anchors, embed, head, top_k=6, chunk_size=chunk_size)
    assert drafts.greedy.shape == (len(anchors), cfg.block_size - 1)
    assert drafts.top_ids.shape == drafts.top_logprobs.shape == (len(anchors), cfg.block_size - 1, 6)
    for s in anchors:
        block = torch.tensor([int(token_ids[s])] + [cfg.mask_token_id] * (cfg.block_size - 1))
        with torch.no_grad():
            logits = draft_block(drafter, taps[:s], block, embed, head)
        assert drafts.greedy_drafts(s) == logits.argmax(-1).tolist()
        values, ids = drafts.top(s)
        expected = torch.log_softmax(logits, dim=-1).topk(6, dim=-1)
        torch.testing.assert_close(values, expected.values, rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, expected.indices)


def test_top_k_is_capped_by_vocab() -> None:
    cfg = small_config()
    drafter = random_drafter(cfg, 3)
    taps, embed, head = torch.randn(5, 96), torch.randn(100, 32), torch.randn(100, 32)
    drafts = draft_anchors(drafter, taps, torch.zeros(5, dtype=torch.long), [1, 3], embed, head, top_k=500)
    assert drafts.top_ids.shape == (2, cfg.block_size - 1, 100)
    torch.testing.assert_close(drafts.top_logprobs.exp().sum(-1), torch.ones(2, cfg.block_size - 1))
