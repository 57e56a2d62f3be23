"""DFlash under probabilistic drafting: one block drafted at every anchor of the response, q of each
block position at the path's token, then the exact expected rounds (`probabilistic.py`).

A DFlash block at anchor s reads only the context < s and `[y[s], MASK, ...]`, so its position j is the
same whatever the round accepted before it: drafting every anchor once gives every cell.

Cost beside the greedy walk: the greedy walk drafts ~(T - prompt_len) / tau blocks per prompt and
projects only the positions up to a block's first miss; this drafts every anchor, T - 1 - prompt_len
blocks, and projects every position that has a reference token through the full-vocab lm_head
(~(B - 1) rows per anchor), plus one target lm_head row per response position for p_T at T > 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.probabilistic import (
    LOGIT_ELEMENTS,
    PAST_END,
    AnchorCells,
    draft_token_probs,
    expected_chains,
    padded_ids,
)
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, TargetNorm
from eval_worker.families.dflash.drafter import ContextKV, DFlashDrafter, stack_kv
from schemas.report import ExpectedRounds
from schemas.sampling import SamplingParams


def _draft_rows(
    drafter: DFlashDrafter,
    kv: ContextKV,
    cells: AnchorCells,
    rows: Tensor,
    token_ids: Tensor,
    embed: Tensor,
    lm_head: Tensor,
    cost: DraftCost,
) -> None:
    """Draft the blocks of `rows` [m] (one forward) and fill their cells' q."""
    device = embed.device
    cfg = drafter.cfg
    anchors, which = cells.anchors[rows].to(device), cells.prompt[rows].to(device)
    masks = torch.full((len(rows), cfg.block_size - 1), cfg.mask_token_id, dtype=torch.long, device=device)
    block_ids = torch.cat([token_ids[which, anchors][:, None], masks], dim=1)  # [m, B]
    h = drafter(block_ids, anchors, kv, embed, which)  # [m, B-1, H]
    cost.drafted(len(rows))
    reference = cells.reference[rows].to(device)  # [m, B-1]
    valid = reference != PAST_END
    hv, tokens = h[valid], reference[valid]  # [N, H], [N]: the cells with a reference token
    temperature = cells.temperature[rows].to(device)[:, None].expand_as(reference)[valid]  # [N]
    q = torch.empty(len(tokens), device=device)
    per = max(1, LOGIT_ELEMENTS // lm_head.shape[0])
    for lo in range(0, len(tokens), per):
        hi = min(lo + per, len(tokens))
        q[lo:hi] = draft_token_probs(F.linear(hv[lo:hi], lm_head), tokens[lo:hi], temperature[lo:hi])
    cost.lm_head_rows += len(tokens)
    block = cells.q[rows]
    block[valid.cpu()] = q.cpu().double()
    cells.q[rows] = block


@torch.no_grad()
def expected_dflash_prompts(
    drafter: DFlashDrafter,
    prompts: Sequence[PromptFeatures],
    last_layers: Sequence[Tensor],
    sampling: Sequence[SamplingParams],
    embed: Tensor,
    lm_head: Tensor,
    final_norm: TargetNorm,
    *,
    cost: DraftCost,
    max_blocks: int = 64,
) -> list[ExpectedRounds]:
    """Per prompt, the chain's expected rounds under probabilistic drafting at the prompt's `sampling`.

    `last_layers[i]` [T_i, H] is the target's last decoder layer (raw, before the final norm) over prompt
    i's tokens; `final_norm` is that norm; `embed` / `lm_head` [V, H] the target's."""
    cells = AnchorCells.of(prompts, sampling, drafter.cfg.block_size - 1)
    if len(cells.anchors):
        started = time.perf_counter()
        kv = stack_kv([drafter.context_kv(p.taps) for p in prompts])
        token_ids = padded_ids(prompts).to(embed.device)  # [P, T_max]
        for lo in range(0, len(cells.anchors), max_blocks):
            rows = torch.arange(lo, min(lo + max_blocks, len(cells.anchors)))
            _draft_rows(drafter, kv, cells, rows, token_ids, embed, lm_head, cost)
        cost.draft_s += time.perf_counter() - started
    return expected_chains(cells, prompts, last_layers, sampling, lm_head, final_norm, cost)


def expected_dflash(
    checkpoint: LoadedCheckpoint,
    prompts: Sequence[PromptFeatures],
    last_layers: Sequence[Tensor],
    sampling: Sequence[SamplingParams],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> list[ExpectedRounds]:
    """The DFlash family's chain under probabilistic drafting (`expected_dflash_prompts`), per prompt."""
    drafter = checkpoint.drafter
    assert isinstance(drafter, DFlashDrafter)
    return expected_dflash_prompts(
        drafter,
        prompts,
        last_layers,
        sampling,
        heads.embed,
        heads.lm_head,
        heads.norm(),
        cost=cost,
        max_blocks=opts.max_blocks,
    )
