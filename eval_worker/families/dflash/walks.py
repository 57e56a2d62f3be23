"""Walk-driven drafting: draft only the anchors the acceptance walks visit, and project through
`lm_head` only the positions a walk can use.

Every prompt has one walk per way of drafting: the greedy chain and DDTree-b for each budget b. A
walk at anchor s needs one drafted block; it accepts a tokens and moves to s + a + 1. Wave r drafts
round r of every active walk of a group of prompts at once (one drafter forward, each block reading
its own prompt's context); walks that stand on the same anchor share its block. Offline the reference
tokens are known, so:
- the chain projects position j only for blocks whose drafts matched at positions < j;
- DDTree-b projects positions 1..min(b, B-1): a tree of b nodes is never deeper than b.

The per-round taus equal those of drafting every anchor (the reference in `testing/all_anchor.py`) and then
walking: the same blocks, read at the positions the walk reads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, Walked
from eval_worker.families.dflash.config import DFlashConfig
from eval_worker.families.dflash.drafter import ContextKV, DFlashDrafter, stack_kv
from eval_worker.scoring.ddtree import accepted_nodes, build_tree
from eval_worker.scoring.summary import round_taus
from schemas.eval_spec import DFlashOptions
from schemas.report import DFlashDrafting

CHAIN = 0  # the walk key of the chain; DDTree walks are keyed by their budget (>= 1)
_LOGIT_ELEMENTS = 1 << 26  # floats of full-vocab logits held at once (256 MB in fp32)


@dataclass
class _Walk:
    prompt: int
    budget: int  # CHAIN or a DDTree budget
    s: int
    taus: list[int] = field(default_factory=list)


@dataclass
class _Drafted:
    """What is known of one drafted block: greedy drafts of its first positions, and the trees' top-k
    log-probs and ids [depth, k] (None until a tree walk needed them)."""

    greedy: list[int] = field(default_factory=list)
    top: tuple[Tensor, Tensor] | None = None

    def chain_accepts(self, reference: Sequence[int]) -> int | None:
        """Accepted chain drafts, or None if the greedy drafts known so far do not decide it."""
        for j, token in enumerate(reference):
            if j >= len(self.greedy):
                return None
            if self.greedy[j] != token:
                return j
        return len(reference)

    def accepts(self, budget: int, reference: Sequence[int]) -> int | None:
        """Drafts the walk `budget` (CHAIN or a DDTree budget) accepts here, or None if undecided."""
        if budget == CHAIN:
            return self.chain_accepts(reference)
        return None if self.top is None else accepted_nodes(build_tree(*self.top, budget), reference)

    def tree_depth(self) -> int:
        """Positions the stored top-k covers."""
        return 0 if self.top is None else int(self.top[0].shape[0])


@torch.no_grad()
def walk_prompts(
    drafter: DFlashDrafter,
    prompts: Sequence[PromptFeatures],
    embed_tokens: Tensor,
    lm_head: Tensor,
    *,
    tree_budgets: Sequence[int],
    top_k: int,
    cost: DraftCost,
    max_blocks: int = 64,
) -> list[dict[int, list[int]]]:
    """Per prompt, the round taus of every walk: {CHAIN: [...], b: [...] for b in tree_budgets}.

    `top_k` is how many candidates per position trees choose from (>= max(tree_budgets))."""
    block = drafter.cfg.block_size
    started = time.perf_counter()
    kv = stack_kv([drafter.context_kv(p.taps) for p in prompts])
    cost.draft_s += time.perf_counter() - started
    walks = [_Walk(i, b, p.prompt_len) for i, p in enumerate(prompts) for b in (CHAIN, *tree_budgets)]
    drafted: dict[tuple[int, int], _Drafted] = {}  # (prompt, anchor) -> what its block drafted
    while True:
        active = [w for w in walks if w.s < len(prompts[w.prompt].token_ids) - 1]
        if not active:
            break
        at: dict[tuple[int, int], set[int]] = {}  # anchor -> the walks standing on it
        for w in active:
            at.setdefault((w.prompt, w.s), set()).add(w.budget)
        # Blocks to draft this wave: anchors where some walk cannot be decided from what is known.
        todo = {
            key: budgets
            for key, budgets in at.items()
            if key not in drafted
            or not all(_decided(drafted[key], b, _reference(prompts, key, block), block) for b in budgets)
        }
        keys = list(todo)
        started = time.perf_counter()
        for lo in range(0, len(keys), max_blocks):
            chunk = keys[lo : lo + max_blocks]
            drafted |= _draft(drafter, kv, prompts, chunk, todo, embed_tokens, lm_head, top_k, cost)
        cost.draft_s += time.perf_counter() - started
        started = time.perf_counter()
        for w in active:
            key = (w.prompt, w.s)
            a = drafted[key].accepts(w.budget, _reference(prompts, key, block))
            if a is None:  # cannot happen: this wave drafted every block that did not decide its walks
                raise RuntimeError(f"the block drafted at {key} does not decide walk {w.budget}")
            w.taus.append(a + 1)
            w.s += a + 1
        cost.walk_s += time.perf_counter() - started
    out: list[dict[int, list[int]]] = [{} for _ in prompts]
    for w in walks:
        out[w.prompt][w.budget] = w.taus
    return out


def _reference(prompts: Sequence[PromptFeatures], key: tuple[int, int], block: int) -> list[int]:
    """The target's tokens a block drafted at anchor s is compared with: t[s+1 .. s+B-1], as many as remain."""
    ids, s = prompts[key[0]].token_ids, key[1]
    return ids[s + 1 : min(s + block, len(ids))]


def _decided(known: _Drafted, budget: int, reference: Sequence[int], block: int) -> bool:
    """Whether walk `budget` can be scored from `known` without drafting the block again."""
    if budget == CHAIN:
        return known.chain_accepts(reference) is not None
    return known.tree_depth() >= min(budget, block - 1)


def _draft(
    drafter: DFlashDrafter,
    kv: ContextKV,
    prompts: Sequence[PromptFeatures],
    keys: list[tuple[int, int]],
    todo: dict[tuple[int, int], set[int]],
    embed_tokens: Tensor,
    lm_head: Tensor,
    top_k: int,
    cost: DraftCost,
) -> dict[tuple[int, int], _Drafted]:
    """Draft one block per (prompt, anchor) key, projecting what the walks in `todo[key]` need."""
    cfg, device = drafter.cfg, embed_tokens.device
    b = cfg.block_size
    block_ids = torch.tensor(
        [[prompts[p].token_ids[s]] + [cfg.mask_token_id] * (b - 1) for p, s in keys], device=device
    )  # [m, B]
    anchors = torch.tensor([s for _, s in keys], device=device)
    which = torch.tensor([p for p, _ in keys], device=device)
    h = drafter(block_ids, anchors, kv, embed_tokens, which)  # [m, B-1, H]
    cost.drafted(len(keys))
    out = [_Drafted() for _ in keys]

    # Trees: full-vocab log-probs of positions 1..depth and their top-k; greedy ids come along.
    by_depth: dict[int, list[int]] = {}
    for row, key in enumerate(keys):
        depth = max((min(budget, b - 1) for budget in todo[key] if budget != CHAIN), default=0)
        if depth:
            by_depth.setdefault(depth, []).append(row)
    for depth, rows in by_depth.items():
        per = max(1, _LOGIT_ELEMENTS // (depth * lm_head.shape[0]))
        for lo in range(0, len(rows), per):
            part = rows[lo : lo + per]
            logits = F.linear(h[part, :depth], lm_head)  # [r, depth, V]
            cost.lm_head_rows += len(part) * depth
            values, ids = torch.log_softmax(logits.float(), dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)
            for i, row in enumerate(part):
                out[row].greedy = logits[i].argmax(dim=-1).tolist()
                out[row].top = (values[i].cpu(), ids[i].cpu())

    # The chain: position j only for blocks whose drafts matched at every position before it.
    references = [_reference(prompts, key, b) for key in keys]
    alive = [row for row, key in enumerate(keys) if CHAIN in todo[key]]
    for j in range(b - 1):
        alive = [row for row in alive if j < len(references[row])]
        project = [row for row in alive if j >= len(out[row].greedy)]
        if project:
            tokens = F.linear(h[project, j], lm_head).argmax(dim=-1).tolist()  # [r]
            cost.lm_head_rows += len(project)
            for row, token in zip(project, tokens, strict=True):
                out[row].greedy.append(token)
        alive = [row for row in alive if out[row].greedy[j] == references[row][j]]
    return dict(zip(keys, out, strict=True))


def walk_dflash(
    checkpoint: LoadedCheckpoint,
    prompts: Sequence[PromptFeatures],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> list[Walked]:
    """The DFlash family's walk: the chain and DDTree-b for every budget of the checkpoint's options (none
    when `opts` walks the chain alone), per prompt."""
    assert isinstance(checkpoint.drafter, DFlashDrafter)
    budgets = checkpoint.options_as(DFlashOptions).tree_budgets if opts.trees else []
    walked = walk_prompts(
        checkpoint.drafter,
        prompts,
        heads.embed,
        heads.lm_head,
        tree_budgets=budgets,
        top_k=max(budgets, default=1),
        cost=cost,
        max_blocks=opts.max_blocks,
    )
    return [Walked(taus[CHAIN], trees={b: round_taus(taus[b]) for b in budgets}) for taus in walked]


def dflash_report_fields(checkpoint: LoadedCheckpoint) -> DFlashDrafting:
    """What a DFlash report says of its drafting: block size, mask token, DDTree budgets."""
    cfg = checkpoint.config
    assert isinstance(cfg, DFlashConfig)
    budgets = list(checkpoint.options_as(DFlashOptions).tree_budgets)
    return DFlashDrafting(
        family="dflash", block_size=cfg.block_size, mask_token_id=cfg.mask_token_id, tree_budgets=budgets
    )
