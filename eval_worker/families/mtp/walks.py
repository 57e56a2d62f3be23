"""MTP rounds walked offline: the greedy chain of `steps` drafts, the one head reused at every step as
vLLM runs it (`num_speculative_tokens` > 1 with a single MTP layer).

The head reads the target's last layer through its final norm (vLLM hands an MTP head the target
model's output, which is normed), paired with the next token. A prompt's context is one causal pass over
those (`MtpDrafter.prefill`): in the live loop every accepted position's cached states come from target
features. A round anchored at s starts from the output at position s-1 (its first draft); draft j + 1
comes from a step at position s + j - 1 reading the previous output and draft j. Wave r runs round r
of every active walk of a group of prompts, stacked in one forward per draft step; a round stops
drafting at its first miss. Trees are not drafted for MTP heads: their options belong to other families.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.errors import FeatureMismatch
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, Walked
from eval_worker.evaluation.waves import CHAIN, RoundWalk, walk_in_waves
from eval_worker.families.mtp.drafter import MtpDrafter
from schemas.eval_spec import MtpOptions
from schemas.report import ExpectedRounds, MtpDrafting

DEFAULT_STEPS = 1  # one draft per round: the head's own training target, and vLLM's for one MTP layer


@dataclass(frozen=True)
class _Group:
    """A group of prompts on the drafter's device: stacked contexts and their outputs."""

    drafter: MtpDrafter
    prompts: Sequence[PromptFeatures]
    first: Tensor  # [P, heads, T_max, D]
    second: Tensor
    outs: list[Tensor]  # per prompt [T-1, H]

    @classmethod
    def of(cls, drafter: MtpDrafter, prompts: Sequence[PromptFeatures], heads: DeviceHeads) -> _Group:
        """The prompts' contexts: each one causal pass over its normed last layer and next tokens."""
        if heads.final_norm is None:
            raise FeatureMismatch(
                "an MTP head reads the target's last layer through its final norm, and this target's final norm "
                "is not an RMSNorm the cache serves"
            )
        norm = heads.final_norm
        contexts = [
            drafter.prefill(norm(p.taps), torch.tensor(p.token_ids, device=p.taps.device), heads.embed) for p in prompts
        ]
        return cls(
            drafter,
            prompts,
            _stack([c.first for c in contexts]),
            _stack([c.second for c in contexts]),
            [c.out for c in contexts],
        )


def _stack(states: list[Tensor]) -> Tensor:
    """[1, heads, T_i - 1, D] per prompt -> [P, heads, T_max, D], zero past each one's end (never visible)."""
    longest = max(s.shape[-2] for s in states)
    return torch.cat([F.pad(s, (0, 0, 0, longest - s.shape[-2])) for s in states])


def _chain_round(
    group: _Group, walks: list[RoundWalk], steps: int, lm_head: Tensor, embed: Tensor, cost: DraftCost
) -> list[int]:
    """Greedy drafts d_1..d_steps of each round, stopping a round at its first miss -> accepted drafts."""
    drafter, device = group.drafter, group.first.device
    refs = [w.reference(group.prompts, steps) for w in walks]
    accepted = [0] * len(walks)
    rows = list(range(len(walks)))  # rounds still matching
    x = torch.stack([group.outs[w.prompt][w.s - 1] for w in walks])  # [m, H]
    which = torch.tensor([w.prompt for w in walks], device=device)
    anchors = torch.tensor([w.s for w in walks], device=device)
    c = int(anchors.max())
    context = (group.first[which][..., :c, :], group.second[which][..., :c, :])
    visible = torch.arange(c, device=device)[None, :] < anchors[:, None]  # [m, C]
    chain = (context[0][..., :0, :], context[1][..., :0, :])
    for j in range(steps):
        tokens = (x @ lm_head.T).argmax(dim=-1).tolist()
        cost.lm_head_rows += len(rows)
        keep = [i for i, (row, t) in enumerate(zip(rows, tokens, strict=True)) if t == refs[row][j]]
        for i in keep:
            accepted[rows[i]] += 1
        keep = [i for i in keep if j + 1 < min(steps, len(refs[rows[i]]))]  # a further draft can count
        if not keep:
            break
        rows = [rows[i] for i in keep]
        idx = torch.tensor(keep, device=device)
        context, visible = (context[0][idx], context[1][idx]), visible[idx]
        chain = (chain[0][idx], chain[1][idx])
        positions = torch.tensor([walks[r].s + j for r in rows], device=device)
        token_ids = torch.tensor([tokens[i] for i in keep], device=device)
        x, new = drafter.step(x[idx], token_ids, positions, context, visible, chain, embed)
        chain = (torch.cat([chain[0], new[0]], dim=-2), torch.cat([chain[1], new[1]], dim=-2))
    return accepted


def mtp_steps(checkpoint: LoadedCheckpoint) -> int:
    """Chain drafts per round: the option, else one."""
    return checkpoint.options_as(MtpOptions).steps or DEFAULT_STEPS


@torch.no_grad()
def walk_mtp(
    checkpoint: LoadedCheckpoint,
    prompts: Sequence[PromptFeatures],
    heads: DeviceHeads,
    opts: EvalOptions,
    cost: DraftCost,
) -> list[Walked]:
    """The MTP family's walk: each prompt's chain rounds (the target's embedding and lm_head)."""
    drafter = checkpoint.drafter
    assert isinstance(drafter, MtpDrafter)
    steps = mtp_steps(checkpoint)
    started = time.perf_counter()
    group = _Group.of(drafter, prompts, heads)
    cost.draft_s += time.perf_counter() - started
    walks = [RoundWalk(i, p.prompt_len) for i, p in enumerate(prompts)]
    chain = {CHAIN: lambda ws: _chain_round(group, ws, steps, heads.lm_head, heads.embed, cost)}
    walk_in_waves(prompts, walks, chain, opts.max_blocks, cost)
    return [Walked(w.taus) for w in walks]


def mtp_report_fields(checkpoint: LoadedCheckpoint) -> MtpDrafting:
    """What an MTP report says of its drafting: chain steps, its layout, the heads the checkpoint has."""
    return MtpDrafting(steps=mtp_steps(checkpoint), mtp_layers=1, layout=checkpoint.layout)


def expected_mtp(checkpoint: LoadedCheckpoint, *_: object) -> list[ExpectedRounds]:
    """Probabilistic drafting is not evaluated for MTP heads: refused by name."""
    raise ValueError(
        f"{checkpoint.path}: --draft-sampling probabilistic is not evaluated for MTP heads; use greedy "
        "(exact on sampled responses too)"
    )
