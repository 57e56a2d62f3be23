"""EAGLE-3 under probabilistic drafting: from every anchor, the chain teacher-forced along the path,
q of each step at the path's token, then the exact expected rounds (`probabilistic.py`).

Step j of a round is drafted after steps 1..j-1 were accepted, which means they drafted the path's
tokens y[s+1 .. s+j-1]: so step j is fed those tokens (and the drafter's own outputs), exactly as the
live loop feeds its accepted drafts. The chains of many anchors run stacked, one forward per step.
q is the draft-vocab softmax at the sampling temperature; a path token outside the draft vocab has q = 0.

Cost beside the greedy walk: the greedy walk drafts ~(T - prompt_len) / tau rounds per prompt, each
stopping at its first miss; this runs a chain from every anchor, T - 1 - prompt_len of them, each of
`steps` drafter steps and draft-vocab lm_head rows (fewer near the response's end), plus one target
lm_head row per response position for p_T at T > 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.probabilistic import PAST_END, AnchorCells, draft_token_probs, expected_chains
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, TargetNorm
from eval_worker.families.eagle3.drafter import Eagle3Context, Eagle3Drafter, NodeBatch
from eval_worker.families.eagle3.walks import eagle3_steps
from schemas.report import ExpectedRounds
from schemas.sampling import SamplingParams


@dataclass(frozen=True)
class _Contexts:
    """The prompts' contexts on target features, stacked: keys/values [P, nkv, T_max-1, D], roots [P, T_max-1, H]."""

    keys: Tensor
    values: Tensor
    roots: Tensor

    @classmethod
    def of(cls, contexts: list[Eagle3Context]) -> _Contexts:
        longest = max(c.keys.shape[1] for c in contexts)  # zero past each one's end, never visible

        def stacked(ts: list[Tensor], dim: int) -> Tensor:
            return torch.stack([F.pad(t, (0, 0, 0, longest - t.shape[dim])) for t in ts])

        return cls(
            stacked([c.keys for c in contexts], 1),
            stacked([c.values for c in contexts], 1),
            stacked([c.roots for c in contexts], 0),
        )


def target_to_draft(drafter: Eagle3Drafter, vocab_size: int) -> Tensor:
    """[V] long: each target id's draft id, PAST_END for ids outside the draft vocab."""
    draft = torch.arange(drafter.cfg.draft_vocab_size, device=drafter.d2t.device)
    out = torch.full((vocab_size,), PAST_END, dtype=torch.long, device=drafter.d2t.device)
    out[drafter.to_target(draft)] = draft
    return out


def _chains(
    drafter: Eagle3Drafter, ctx: _Contexts, cells: AnchorCells, rows: Tensor, to_draft: Tensor, embed: Tensor
) -> int:
    """Teacher-forced chains from the anchors of `rows` [m], stacked; fills their cells' q -> lm_head rows."""
    device = ctx.keys.device
    reference = cells.reference[rows].to(device)  # [m, K] target ids, PAST_END past the end
    in_draft = torch.where(reference >= 0, to_draft[reference.clamp(min=0)], PAST_END)  # [m, K]
    anchors, which = cells.anchors[rows].to(device), cells.prompt[rows].to(device)
    temperature = cells.temperature[rows].to(device)
    left = (reference != PAST_END).sum(dim=1)  # [m]: steps with a reference token
    alive = torch.arange(len(rows), device=device)  # rows still drafting
    x = ctx.roots[which, anchors - 1]  # [m, H]: the pass's output at s-1 drafts step 1
    k = ctx.keys
    tree_keys = k.new_zeros(len(rows), k.shape[1], 0, k.shape[3])  # [m, nkv, 0, D]: this round's own steps
    tree_values, projected = tree_keys.clone(), 0
    c = int(anchors.max())  # context positions any of these rounds sees
    for j in range(reference.shape[1]):
        q = draft_token_probs(drafter.logits(x), in_draft[alive, j], temperature[alive])  # [n]
        cells.q[rows[alive.cpu()], j] = q.cpu().double()
        projected += len(alive)
        keep = left[alive] > j + 1  # a further step has a reference token
        if not bool(keep.any()):
            break
        alive, x = alive[keep], x[keep]
        tree_keys, tree_values = tree_keys[keep], tree_values[keep]
        visible = torch.ones(len(alive), 1, tree_keys.shape[2], dtype=torch.bool, device=device)
        batch = NodeBatch(
            ctx.keys[..., :c, :], ctx.values[..., :c, :], which[alive], anchors[alive], tree_keys, tree_values, visible
        )
        tokens = reference[alive, j][:, None]  # [n, 1]: the path's token, as if step j drafted it
        out, nk, nv = drafter.step(drafter.feedback(x)[:, None], tokens, anchors[alive] + j, batch, embed)
        x = out[:, 0]
        tree_keys, tree_values = torch.cat([tree_keys, nk], dim=2), torch.cat([tree_values, nv], dim=2)
    return projected


@torch.no_grad()
# the tensors of the math, by name
def expected_eagle3_prompts(  # noqa: PLR0913
    drafter: Eagle3Drafter,
    prompts: Sequence[PromptFeatures],
    last_layers: Sequence[Tensor],
    sampling: Sequence[SamplingParams],
    embed_tokens: Tensor,
    lm_head: Tensor,
    final_norm: TargetNorm,
    *,
    steps: int,
    cost: DraftCost,
    max_rounds: int = 64,
) -> list[ExpectedRounds]:
    """Per prompt, the expected rounds of a chain of `steps` drafts under probabilistic drafting at the
    prompt's `sampling`; `embed_tokens` [V, H] is what the drafter embeds tokens with.

    `last_layers[i]` [T_i, H] is the target's last decoder layer (raw, before the final norm) over prompt
    i's tokens; `final_norm` is that norm; `lm_head` [V, H] the target's."""
    cells = AnchorCells.of(prompts, sampling, steps)
    if len(cells.anchors):
        started = time.perf_counter()
        contexts = [
            drafter.prefill(p.taps, torch.tensor(p.token_ids, device=p.taps.device), embed_tokens) for p in prompts
        ]
        ctx = _Contexts.of(contexts)
        to_draft = target_to_draft(drafter, embed_tokens.shape[0])
        for lo in range(0, len(cells.anchors), max_rounds):
            rows = torch.arange(lo, min(lo + max_rounds, len(cells.anchors)))
            cost.lm_head_rows += _chains(drafter, ctx, cells, rows, to_draft, embed_tokens)
            cost.drafted(len(rows))
        cost.draft_s += time.perf_counter() - started
    return expected_chains(cells, prompts, last_layers, sampling, lm_head, final_norm, cost)


def expected_eagle3(
    checkpoint: LoadedCheckpoint,
    prompts: Sequence[PromptFeatures],
    last_layers: Sequence[Tensor],
    sampling: Sequence[SamplingParams],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> list[ExpectedRounds]:
    """The EAGLE-3 family's chain (`eagle3_steps` drafts) under probabilistic drafting, per prompt
    (`expected_eagle3_prompts`): the drafter's own embedding when it has one, else the target's."""
    drafter = checkpoint.drafter
    assert isinstance(drafter, Eagle3Drafter)
    return expected_eagle3_prompts(
        drafter,
        prompts,
        last_layers,
        sampling,
        drafter.embed_tokens.weight if drafter.has_embed else heads.embed,
        heads.lm_head,
        heads.norm(),
        steps=eagle3_steps(checkpoint),
        cost=cost,
        max_rounds=opts.max_blocks,
    )
