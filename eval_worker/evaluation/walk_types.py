"""What every family's walk takes and gives: a prompt's features and the target's heads on the
drafter's device (its final norm computed as transformers does), the work counted while drafting, and
one prompt's walked rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from cache_server.client import TargetHeads
from cache_server.client.results import as_tensor
from cache_server.torch_utils import rms_norm
from eval_worker.errors import FeatureMismatch
from eval_worker.evaluation.options import EvalOptions
from schemas.report import RoundTaus


@dataclass(frozen=True)
class PromptFeatures:
    """One prompt on the drafter's device: taps [T, K*H] and token ids [T] (prompt + response)."""

    taps: Tensor
    token_ids: list[int]
    prompt_len: int


@dataclass(frozen=True)
class TargetNorm:
    """The target's final RMSNorm as the cache serves it: `weight * x / rms(x)`, or `(1 + weight) * x / rms(x)`
    when `zero_centered` (Qwen3-Next, Qwen3.5: the weight is stored zero-centred)."""

    weight: Tensor  # [H]
    eps: float
    zero_centered: bool = False

    @classmethod
    def served(cls, heads: TargetHeads) -> TargetNorm | None:
        """The final norm in `heads`, on the CPU in the served dtype; None when the cache serves none."""
        if heads.final_norm is None or heads.final_norm_eps is None:
            return None
        return cls(as_tensor(heads.final_norm).clone(), heads.final_norm_eps, heads.final_norm_zero_centered)

    def to(self, device: torch.device | str, dtype: torch.dtype) -> TargetNorm:
        """The same norm with its weight on `device` in `dtype` (as a target loaded in `dtype` holds it)."""
        return dataclasses.replace(self, weight=self.weight.to(device, dtype))

    def __call__(self, hidden: Tensor) -> Tensor:
        """The last layer's raw output [..., H] -> normed, as the server's capture norms it (`rms_norm`)."""
        return rms_norm(hidden, self.weight, self.eps, self.zero_centered)


@dataclass(frozen=True)
class DeviceHeads:
    """The target's heads on the drafter's device: embedding and lm_head [V, H], and its final RMSNorm
    whenever the cache serves one (None: the target's final norm is not an RMSNorm the cache serves)."""

    embed: Tensor
    lm_head: Tensor
    final_norm: TargetNorm | None

    @classmethod
    def of(cls, heads: TargetHeads, opts: EvalOptions) -> DeviceHeads:
        """`heads` on `opts`' device and dtype; FeatureMismatch when probabilistic drafting is asked of a
        target whose final norm the cache does not serve."""
        embed, lm_head = (t.to(opts.device, opts.dtype) for t in heads.to_torch())
        norm = TargetNorm.served(heads)
        if norm is None:
            if opts.draft_sampling == "probabilistic":
                raise FeatureMismatch(
                    "probabilistic drafting needs the target's distribution, lm_head(norm(last layer)), and this "
                    "target's final norm is not an RMSNorm the cache serves: use --draft-sampling greedy"
                )
            return cls(embed, lm_head, None)
        return cls(embed, lm_head, norm.to(opts.device, opts.dtype))

    def norm(self) -> TargetNorm:
        """The final norm, which probabilistic drafting needs (`of` refused a target without one)."""
        if self.final_norm is None:
            raise FeatureMismatch("this target's final norm is not served: its distribution cannot be computed")
        return self.final_norm


@dataclass
class DraftCost:
    """Drafter work counted while walking; `watch` hears of every drafter forward (progress, and a
    stopped walk's way out: it may raise)."""

    drafted_blocks: int = 0  # drafter block forwards
    lm_head_rows: int = 0  # positions projected through lm_head
    draft_s: float = 0.0  # drafter forwards and lm_head projections (context k/v included)
    walk_s: float = 0.0  # building trees and walking them
    watch: Callable[[int], None] | None = field(default=None, repr=False, compare=False)

    def drafted(self, blocks: int) -> None:
        """One drafter forward drafted `blocks` blocks."""
        self.drafted_blocks += blocks
        if self.watch is not None:
            self.watch(blocks)


@dataclass(frozen=True)
class Walked:
    """One prompt's rounds: the chain's accepted tokens per round, and the rounds of each tree (DDTree
    budgets for DFlash, EAGLE's dynamic trees by shape for EAGLE-3)."""

    chain: list[int]
    trees: dict[int, RoundTaus] = field(default_factory=dict)
    eagle_trees: dict[str, RoundTaus] = field(default_factory=dict)
