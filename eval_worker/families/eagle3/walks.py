"""EAGLE-3 rounds walked offline: the greedy chain of `steps` drafts and EAGLE's dynamic trees.

A prompt's context is one causal pass of the drafter over its target features (`Eagle3Drafter.prefill`):
in the live loop every accepted position's drafter keys and values come from target features, so the
pass gives each round's context and its first draft at once. A round anchored at s starts from the
output at position s-1, and its later drafts are `step`s at positions s, s+1, ... Wave r runs round r of
every active walk of a group of prompts, the rounds of one kind stacked in one forward per draft step.
The chain stops drafting a round at its first miss; a tree is drafted whole, as `topK_genrate` drafts it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, Walked
from eval_worker.evaluation.waves import CHAIN, DraftRounds, RoundWalk, walk_in_waves  # trees: keyed "TOPK,DEPTH,TOTAL"
from eval_worker.families.eagle3.config import Eagle3Config
from eval_worker.families.eagle3.drafter import Eagle3Context, Eagle3Drafter, NodeBatch
from eval_worker.scoring.eagle_tree import select_tree, stable_topk
from eval_worker.scoring.summary import round_taus
from schemas.eval_spec import Eagle3Options
from schemas.report import Eagle3Drafting
from schemas.trees import EagleTreeShape


@dataclass(frozen=True)
class _Group:
    """A group of prompts on the drafter's device: stacked contexts and their roots."""

    drafter: Eagle3Drafter
    prompts: Sequence[PromptFeatures]
    keys: Tensor  # [P, nkv, T_max, D]
    values: Tensor
    roots: list[Tensor]  # per prompt [T-1, H]
    embed: Tensor

    def batch(self, walks: Sequence[RoundWalk], tree_keys: Tensor, tree_values: Tensor, visible: Tensor) -> NodeBatch:
        device = self.keys.device
        anchors = torch.tensor([w.s for w in walks], device=device)
        c = int(anchors.max())  # context positions any of these rounds sees
        return NodeBatch(
            self.keys[..., :c, :],
            self.values[..., :c, :],
            torch.tensor([w.prompt for w in walks], device=device),
            anchors,
            tree_keys,
            tree_values,
            visible,
        )

    def first(self, walks: Sequence[RoundWalk]) -> Tensor:
        """Each round's root output [m, H] (the pass's output at s-1)."""
        return torch.stack([self.roots[w.prompt][w.s - 1] for w in walks])


@torch.no_grad()
def walk_eagle_prompts(
    drafter: Eagle3Drafter,
    prompts: Sequence[PromptFeatures],
    embed_tokens: Tensor,
    *,
    steps: int,
    trees: Sequence[EagleTreeShape],
    cost: DraftCost,
    max_rounds: int = 64,
) -> list[dict[str, list[int]]]:
    """Per prompt, the round taus of the chain ("chain") and of every tree (keyed "TOPK,DEPTH,TOTAL")."""
    started = time.perf_counter()
    contexts = [drafter.prefill(p.taps, torch.tensor(p.token_ids, device=p.taps.device), embed_tokens) for p in prompts]
    group = _Group(drafter, prompts, *_stack(contexts), [c.roots for c in contexts], embed_tokens)
    cost.draft_s += time.perf_counter() - started
    kinds: dict[str, DraftRounds] = {CHAIN: partial(_chain_round, group, steps=steps, cost=cost)}
    for shape in trees:
        kinds[shape.key] = partial(_tree_round, group, shape=shape, cost=cost)
    walks = [RoundWalk(i, p.prompt_len, kind) for i, p in enumerate(prompts) for kind in kinds]
    walk_in_waves(prompts, walks, kinds, max_rounds, cost)
    out: list[dict[str, list[int]]] = [{} for _ in prompts]
    for w in walks:
        out[w.prompt][w.kind] = w.taus
    return out


def _stack(contexts: list[Eagle3Context]) -> tuple[Tensor, Tensor]:
    """Contexts of several prompts as [P, nkv, T_max, D], zero past each one's end (never visible)."""
    longest = max(c.keys.shape[1] for c in contexts)

    def stacked(ts: list[Tensor]) -> Tensor:
        return torch.stack([F.pad(t, (0, 0, 0, longest - t.shape[1])) for t in ts])

    return stacked([c.keys for c in contexts]), stacked([c.values for c in contexts])


def _empty_tree(group: _Group, m: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
    k = group.keys
    keys = k.new_zeros(m, k.shape[1], 0, k.shape[3])
    return keys, keys.clone(), torch.zeros(m, n, 0, dtype=torch.bool, device=k.device)


def _chain_round(group: _Group, walks: list[RoundWalk], steps: int, cost: DraftCost) -> list[int]:
    """Greedy drafts d_1..d_steps of each round, stopping a round at its first miss -> accepted drafts."""
    drafter = group.drafter
    refs = [w.reference(group.prompts, steps) for w in walks]
    accepted = [0] * len(walks)
    rows = list(range(len(walks)))  # rounds still matching
    x = group.first(walks)  # [m, H]
    tree_keys, tree_values, visible = _empty_tree(group, len(walks), 1)
    for j in range(steps):
        tokens = drafter.to_target(drafter.logits(x).argmax(dim=-1)).tolist()
        cost.lm_head_rows += len(rows)
        keep = [i for i, (row, t) in enumerate(zip(rows, tokens, strict=True)) if t == refs[row][j]]
        for i in keep:
            accepted[rows[i]] += 1
        keep = [i for i in keep if j + 1 < min(steps, len(refs[rows[i]]))]  # a further draft can count
        if not keep:
            break
        rows = [rows[i] for i in keep]
        idx = torch.tensor(keep, device=x.device)
        batch = group.batch([walks[r] for r in rows], tree_keys[idx], tree_values[idx], visible[idx])
        positions = torch.tensor([walks[r].s + j for r in rows], device=x.device)
        token_ids = torch.tensor([[tokens[i]] for i in keep], device=x.device)
        x, k, v = drafter.step(drafter.feedback(x[idx])[:, None], token_ids, positions, batch, group.embed)
        x = x[:, 0]
        tree_keys, tree_values = torch.cat([batch.tree_keys, k], dim=2), torch.cat([batch.tree_values, v], dim=2)
        visible = torch.ones(len(rows), 1, tree_keys.shape[2], dtype=torch.bool, device=x.device)
    return accepted


def _tree_round(group: _Group, walks: list[RoundWalk], shape: EagleTreeShape, cost: DraftCost) -> list[int]:
    """EAGLE's `topK_genrate` for each round, all rounds stacked -> accepted nodes of each tree."""
    drafter, k, m = group.drafter, shape.top_k, len(walks)
    device = group.keys.device
    x = group.first(walks)  # [m, H]
    scores, top_ids = stable_topk(torch.log_softmax(drafter.logits(x).float(), dim=-1), k)
    cost.lm_head_rows += m  # scores [m, k]: cumulative log-probs of the frontier
    score_levels, token_levels = [scores], [drafter.to_target(top_ids)]
    parent_levels = [torch.zeros(m, 1, dtype=torch.long, device=device)]
    hidden = drafter.feedback(x)[:, None].expand(m, k, x.shape[-1])
    frontier_tokens = token_levels[0]
    chosen = torch.arange(k, device=device).expand(m, k)  # the frontier's flat index within its level
    tree_keys, tree_values, visible = _empty_tree(group, m, k)
    eye = torch.eye(k, dtype=torch.bool, device=device)
    for i in range(shape.depth):
        batch = group.batch(walks, tree_keys, tree_values, visible)
        positions = torch.tensor([w.s + i for w in walks], device=device)
        out, nk, nv = drafter.step(hidden, frontier_tokens, positions, batch, group.embed)  # [m, k, H]
        # the frontier's flat index + 1 in the concatenated levels (root = 0, then k, then k*k per level)
        parent_levels.append(chosen + (1 + (k if i else 0) + k * k * max(0, i - 1)))
        child_scores, child_ids = stable_topk(torch.log_softmax(drafter.logits(out).float(), dim=-1), k)  # [m, k, k]
        cost.lm_head_rows += m * k
        cumulative = (child_scores + scores[:, :, None]).reshape(m, k * k)
        scores, chosen = stable_topk(cumulative, k)
        parents = chosen // k  # [m, k]: the frontier node each new frontier node extends
        child_tokens = drafter.to_target(child_ids.reshape(m, k * k))
        score_levels.append(cumulative)
        token_levels.append(child_tokens)
        hidden = drafter.feedback(out).gather(1, parents[:, :, None].expand(m, k, out.shape[-1]))
        frontier_tokens = child_tokens.gather(1, chosen)
        tree_keys, tree_values = torch.cat([tree_keys, nk], dim=2), torch.cat([tree_values, nv], dim=2)
        inherited = visible.gather(1, parents[:, :, None].expand(m, k, visible.shape[2]))
        visible = torch.cat([inherited, eye[parents]], dim=2)
    all_scores, all_tokens = torch.cat(score_levels, dim=1).cpu(), torch.cat(token_levels, dim=1).cpu()
    all_parents = torch.cat(parent_levels, dim=1).cpu()
    refs = [w.reference(group.prompts, shape.depth + 1) for w in walks]
    return [select_tree(all_scores[i], all_tokens[i], all_parents[i], shape).accepted(refs[i]) for i in range(m)]


def eagle3_steps(checkpoint: LoadedCheckpoint) -> int:
    """EAGLE-3 chain drafts per round: the options', else the checkpoint's own, else 5."""
    cfg = checkpoint.config
    assert isinstance(cfg, Eagle3Config)
    return checkpoint.options_as(Eagle3Options).steps or cfg.speculative_tokens or 5


def walk_eagle3(
    checkpoint: LoadedCheckpoint,
    prompts: Sequence[PromptFeatures],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> list[Walked]:
    """The EAGLE-3 family's walk: the chain and every dynamic tree of the checkpoint's options (none when
    `opts` walks the chain alone), per prompt (the drafter's own head; its own embedding when it has
    one, else the target's)."""
    drafter = checkpoint.drafter
    assert isinstance(drafter, Eagle3Drafter)
    trees = [EagleTreeShape.parse(t) for t in checkpoint.options_as(Eagle3Options).eagle_trees] if opts.trees else []
    walked = walk_eagle_prompts(
        drafter,
        prompts,
        drafter.embed_tokens.weight if drafter.has_embed else heads.embed,
        steps=eagle3_steps(checkpoint),
        trees=trees,
        cost=cost,
        max_rounds=opts.max_blocks,
    )
    return [Walked(taus[CHAIN], eagle_trees={t.key: round_taus(taus[t.key]) for t in trees}) for taus in walked]


def eagle3_report_fields(checkpoint: LoadedCheckpoint) -> Eagle3Drafting:
    """What an EAGLE-3 report says of its drafting: chain steps, draft vocab, EAGLE trees."""
    cfg = checkpoint.config
    assert isinstance(cfg, Eagle3Config)
    trees = list(checkpoint.options_as(Eagle3Options).eagle_trees)
    return Eagle3Drafting(
        family="eagle3", steps=eagle3_steps(checkpoint), draft_vocab_size=cfg.draft_vocab_size, eagle_trees=trees
    )
