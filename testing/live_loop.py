"""A live greedy speculative-decoding loop (test support): the ground truth the offline walk must match.

Each round the drafter reads taps the target computed for the committed tokens < s, drafts from the
last committed token, and the target verifies the draft with a real forward (full recompute, all
root-to-leaf branches of a tree in one batch). Generation stops at `total_len` tokens, and a round
only compares drafts against the positions that remain, as the offline walk does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from eval_worker.families.dflash.drafter import DFlashDrafter, draft_block
from eval_worker.scoring.ddtree import DraftTree, build_tree
from testing.taps import target_forward


@dataclass(frozen=True)
class LiveResult:
    """What the live loop generated, and how many tokens each of its rounds accepted."""

    token_ids: list[int]  # prompt + generated, exactly total_len tokens
    round_taus: list[int]


def _tree_paths(tree: DraftTree) -> tuple[list[list[int]], list[list[int]]]:
    """Token path and node path from the root to every node (node i's path ends with i)."""
    tokens: list[list[int]] = []
    nodes: list[list[int]] = []
    for i, (parent, token) in enumerate(zip(tree.parents, tree.tokens, strict=True)):
        tokens.append(([] if parent < 0 else tokens[parent]) + [token])
        nodes.append(([] if parent < 0 else nodes[parent]) + [i])
    return tokens, nodes


Branches = tuple[DraftTree | None, list[list[int]], list[list[int]]]


def _branches(logits: Tensor, budget: int | None) -> Branches:
    """Draft logits [B-1, V] -> (tree or None for a chain, branch token lists, branch node lists)."""
    if budget is None:
        chain = [int(t) for t in logits.argmax(dim=-1).tolist()]
        return None, [chain], [list(range(len(chain)))]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = logprobs.topk(min(budget, logprobs.shape[-1]), dim=-1)
    tree = build_tree(top.values, top.indices, budget)
    tokens, nodes = _tree_paths(tree)
    parents = set(tree.parents)
    leaves = [i for i in range(len(tree.tokens)) if i not in parents]
    return tree, [tokens[i] for i in leaves] or [[]], [nodes[i] for i in leaves] or [[]]


def target_heads(target: nn.Module) -> tuple[Tensor, Tensor]:
    """The HF causal LM's input embedding and lm_head weights, both [V, H]."""
    embed = getattr(getattr(target, "model", None), "embed_tokens", None)
    head = getattr(target, "lm_head", None)
    embed, head = getattr(embed, "weight", None), getattr(head, "weight", None)
    if not isinstance(embed, Tensor) or not isinstance(head, Tensor):
        raise TypeError("target has no embedding / lm_head weight tensors")
    return embed.detach(), head.detach()


@torch.no_grad()
def live_decode(
    target: nn.Module,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int],
    total_len: int,
    layer_ids: Sequence[int],
    *,
    budget: int | None = None,
) -> LiveResult:
    """Greedy speculative decoding of `prompt_ids` up to `total_len` tokens; chain, or DDTree-`budget`."""
    embed, lm_head = target_heads(target)
    b, mask = drafter.cfg.block_size, drafter.cfg.mask_token_id
    prefill = target_forward(target, torch.tensor([list(prompt_ids)]), layer_ids)
    committed = [*prompt_ids, int(prefill.logits[0, -1].argmax())]
    taps = prefill.taps[0]  # taps of committed positions < s
    s, taus = len(prompt_ids), []
    while s < total_len - 1:
        block = torch.tensor([committed[s]] + [mask] * (b - 1))
        logits = draft_block(drafter, taps[:s], block, embed, lm_head)
        tree, branch_tokens, branch_nodes = _branches(logits, budget)
        width = max(len(t) for t in branch_tokens)
        batch = torch.tensor([committed[: s + 1] + t + [0] * (width - len(t)) for t in branch_tokens])
        verify = target_forward(target, batch, layer_ids)
        posterior = verify.logits[:, s:].argmax(dim=-1)  # [branches, width + 1]: greedy after each prefix
        remaining = total_len - 1 - s
        branch, a = 0, 0
        while a < remaining:
            wanted = int(posterior[branch, a])
            if tree is None:
                if a >= len(branch_tokens[0]) or branch_tokens[0][a] != wanted:
                    break
            else:
                node = tree.child(branch_nodes[branch][a - 1] if a else -1, wanted)
                if node is None:
                    break
                branch = next(j for j, path in enumerate(branch_nodes) if len(path) > a and path[a] == node)
            a += 1
        committed += [*branch_tokens[branch][:a], int(posterior[branch, a])]
        taps = verify.taps[branch, : s + a + 1]
        taus.append(a + 1)
        s += a + 1
    return LiveResult(committed[:total_len], taus)
