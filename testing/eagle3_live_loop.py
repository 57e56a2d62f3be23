"""A live greedy EAGLE-3 speculative loop (test support): the ground truth the offline EAGLE-3 walk must match.

Each round the drafter's context is recomputed from the target's taps of the committed positions
(as EAGLE refreshes its KV with the verified tokens' features), a chain or EAGLE's `topK_genrate` tree
is drafted node by node - each node attending, one query at a time, to the context, its ancestors and
itself - and the target verifies every root-to-leaf branch with a real forward. Written from the
published code (SafeAILab/EAGLE `cnets.py`, speculators' `norm_before_residual` / `norm_output`),
sharing only the weights and the final tree selection (`select_tree`) with the offline walk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.scoring.eagle_tree import EagleTree, select_tree, stable_topk
from schemas.trees import EagleTreeShape
from testing.live_loop import LiveResult, target_heads
from testing.taps import target_forward


@dataclass
class _Node:
    """One drafter position's key and value, [nkv, D] each (RoPE'd at its position)."""

    key: Tensor
    value: Tensor


def _rope(x: Tensor, pos: int, theta: float) -> Tensor:
    """x [heads, D] rotated to position `pos` (rotate-half, as Llama)."""
    d = x.shape[-1]
    freqs = pos * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cat([freqs, freqs]).cos().float(), torch.cat([freqs, freqs]).sin().float()
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1) * sin


class _Reference:
    """The drafter's math one position at a time."""

    def __init__(self, drafter: Eagle3Drafter, embed: Tensor) -> None:
        self.d, self.cfg, self.embed = drafter, drafter.cfg, embed

    def project(self, taps: Tensor) -> Tensor:
        """fc over the taps, after the layout's feature norm."""
        d, n = self.d, self.d.num_taps
        if self.cfg.feature_norm == "concat":
            taps = d.input_norm(taps)
        elif self.cfg.feature_norm == "per_tap":
            taps = torch.cat([norm(c) for norm, c in zip(d.fc_norm, taps.chunk(n, dim=-1), strict=True)], dim=-1)
        return d.fc(taps)

    def position(self, h: Tensor, token: int, pos: int) -> tuple[Tensor, _Node, Tensor]:
        """Hidden [H] and token at `pos` -> its query [nh, D], key/value, and residual."""
        layer, cfg = self.d.midlayer, self.cfg
        normed = layer.hidden_norm(h)
        x = torch.cat([layer.input_layernorm(self.embed[token]), normed])
        residual = normed if cfg.norm_before_residual else h
        att = layer.self_attn
        q = att.q_proj(x).view(cfg.num_attention_heads, cfg.head_dim)
        k = att.k_proj(x).view(cfg.num_key_value_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = att.q_norm(q), att.k_norm(k)
        v = att.v_proj(x).view(cfg.num_key_value_heads, cfg.head_dim)
        return _rope(q, pos, cfg.rope_theta), _Node(_rope(k, pos, cfg.rope_theta), v), residual

    def output(self, q: Tensor, seen: Sequence[_Node], residual: Tensor) -> Tensor:
        """Attention of q over the `seen` positions, then the residuals and MLP -> x [H]."""
        cfg, layer = self.cfg, self.d.midlayer
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        heads = []
        for h in range(cfg.num_attention_heads):
            keys = torch.stack([n.key[h // group] for n in seen])
            values = torch.stack([n.value[h // group] for n in seen])
            weights = torch.softmax(keys @ q[h] / math.sqrt(cfg.head_dim), dim=0)
            heads.append(weights @ values)
        x = residual + layer.self_attn.o_proj(torch.cat(heads))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def logprobs(self, x: Tensor) -> Tensor:
        d = self.d
        logits = d.lm_head(d.norm(x) if self.cfg.logits_from_norm else x)
        return torch.log_softmax(logits.float(), dim=-1)

    def feedback(self, x: Tensor) -> Tensor:
        return self.d.norm(x) if self.cfg.feed_normed else x

    def target_id(self, draft_id: int) -> int:
        return draft_id + int(self.d.d2t[draft_id])


def _context(ref: _Reference, taps: Tensor, committed: Sequence[int], s: int) -> tuple[list[_Node], Tensor]:
    """Positions 0..s-1 on target features (taps i, token i+1) -> their nodes and the output at s-1."""
    nodes: list[_Node] = []
    x = torch.empty(0)
    for i in range(s):
        q, node, residual = ref.position(ref.project(taps[i]), committed[i + 1], i)
        nodes.append(node)
        x = ref.output(q, nodes, residual)
    return nodes, x


def _chain(ref: _Reference, ctx: list[_Node], root: Tensor, s: int, steps: int) -> list[int]:
    drafts, x, mine = [], root, list(ctx)
    for j in range(steps):
        drafts.append(ref.target_id(int(ref.logprobs(x).argmax())))
        if j + 1 < steps:
            q, node, residual = ref.position(ref.feedback(x), drafts[-1], s + j)
            mine.append(node)
            x = ref.output(q, mine, residual)
    return drafts


def _tree(ref: _Reference, ctx: list[_Node], root: Tensor, s: int, shape: EagleTreeShape) -> EagleTree:
    """topK_genrate: first level from the root, then `depth` expansions of the best top_k."""
    k = shape.top_k
    scores, top_ids = stable_topk(ref.logprobs(root), k)  # ties to the lower id, as the offline walk
    frontier = [ref.target_id(int(i)) for i in top_ids]
    score_levels, token_levels, parent_levels = [scores], [torch.tensor(frontier)], [torch.zeros(1, dtype=torch.long)]
    hidden = [ref.feedback(root)] * k
    sees: list[list[_Node]] = [[] for _ in range(k)]  # each frontier node's ancestors (tree nodes)
    chosen = torch.arange(k)
    for i in range(shape.depth):
        outs, nodes = [], []
        for j in range(k):
            q, node, residual = ref.position(hidden[j], frontier[j], s + i)
            nodes.append(node)
            outs.append(ref.output(q, ctx + sees[j] + [node], residual))
        parent_levels.append(chosen + 1 + (k if i else 0) + k * k * max(0, i - 1))
        children = [stable_topk(ref.logprobs(x), k) for x in outs]
        cumulative = torch.cat([values + scores[j] for j, (values, _) in enumerate(children)])
        child_tokens = torch.tensor([ref.target_id(int(t)) for _, ids in children for t in ids])
        scores, chosen = stable_topk(cumulative, k)
        parents = (chosen // k).tolist()
        hidden = [ref.feedback(outs[p]) for p in parents]
        frontier = [int(child_tokens[c]) for c in chosen]
        sees = [sees[p] + [nodes[p]] for p in parents]
        score_levels.append(cumulative)
        token_levels.append(child_tokens)
    return select_tree(torch.cat(score_levels), torch.cat(token_levels), torch.cat(parent_levels), shape)


def _branches(tree: EagleTree) -> list[list[int]]:
    """The token path from the root to every leaf."""
    paths: list[list[int]] = [[]]
    for parent, token in zip(tree.parents, tree.tokens, strict=True):
        paths.append(paths[parent] + [token])
    parents = set(tree.parents)
    return [paths[i] for i in range(1, len(paths)) if i not in parents] or [[]]


@torch.no_grad()
def live_eagle3_decode(
    target: nn.Module,
    drafter: Eagle3Drafter,
    prompt_ids: Sequence[int],
    total_len: int,
    layer_ids: Sequence[int],
    *,
    steps: int = 3,
    tree: EagleTreeShape | None = None,
) -> LiveResult:
    """Greedy EAGLE-3 speculative decoding of `prompt_ids` up to `total_len` tokens: chain or `tree`."""
    embed, _ = target_heads(target)
    ref = _Reference(drafter, drafter.embed_tokens.weight if drafter.has_embed else embed)
    prefill = target_forward(target, torch.tensor([list(prompt_ids)]), layer_ids)
    committed = [*prompt_ids, int(prefill.logits[0, -1].argmax())]
    taps, s, taus = prefill.taps[0], len(prompt_ids), []
    while s < total_len - 1:
        ctx, root = _context(ref, taps, committed, s)
        branches = [_chain(ref, ctx, root, s, steps)] if tree is None else _branches(_tree(ref, ctx, root, s, tree))
        width = max(len(b) for b in branches)
        batch = torch.tensor([committed[: s + 1] + b + [0] * (width - len(b)) for b in branches])
        verify = target_forward(target, batch, layer_ids)
        posterior = verify.logits[:, s:].argmax(dim=-1)  # greedy token after each prefix of each branch
        remaining = total_len - 1 - s
        best, a = 0, 0
        for i, branch in enumerate(branches):
            n = 0
            while n < min(len(branch), remaining) and branch[n] == int(posterior[i, n]):
                n += 1
            if n > a:
                best, a = i, n
        committed += [*branches[best][:a], int(posterior[best, a])]
        taps = verify.taps[best, : s + a + 1]
        taus.append(a + 1)
        s += a + 1
    return LiveResult(committed[:total_len], taus)
