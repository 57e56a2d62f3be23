"""Train a small DFlash drafter for a few hundred steps on a target's own greedy continuations.

Block-diffusion style: random anchors s, block `[t[s], MASK, ...]`, context = taps < s, cross-entropy
of positions 1..B-1 against t[s+1..s+B-1]. For tests and the demo; not a training recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval_worker.families.dflash.config import DFlashConfig
from eval_worker.families.dflash.drafter import DFlashDrafter
from testing.all_anchor import block_logits
from testing.taps import greedy_continuation, target_forward


@dataclass(frozen=True)
class Sequences:
    """Prompt + greedy response token ids [T_i] and their taps [T_i, K*H]."""

    token_ids: list[Tensor]
    taps: list[Tensor]
    prompt_lens: list[int]

    def prompt_specs(self) -> list[dict[str, Any]]:
        """`POST /prompts` specs of these sequences: each prompt with its (greedy) response given."""
        return [
            {"token_ids": ids[:n].tolist(), "response_token_ids": ids[n:].tolist()}
            for ids, n in zip(self.token_ids, self.prompt_lens, strict=True)
        ]


def make_sequences(
    target: nn.Module, prompts: Sequence[Sequence[int]], layer_ids: Sequence[int], max_new_tokens: int
) -> Sequences:
    """The target's greedy continuations of `prompts` and their taps at `layer_ids`: the training data."""
    ids, taps = [], []
    for prompt in prompts:
        full = greedy_continuation(target, prompt, max_new_tokens)
        ids.append(torch.tensor(full))
        taps.append(target_forward(target, torch.tensor([full]), layer_ids).taps[0])
    return Sequences(ids, taps, [len(p) for p in prompts])


def attention_shape(t: Any) -> dict[str, Any]:
    """A drafter layer shaped like the target's (HF Qwen3 config): hidden, heads, head dim, MLP, norm, RoPE."""
    rope = getattr(t, "rope_parameters", None) or {}
    return {
        "hidden_size": t.hidden_size,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "intermediate_size": t.intermediate_size,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": float(rope.get("rope_theta", getattr(t, "rope_theta", 1e6))),
    }


def tiny_drafter_config(
    target_config: Any,
    layer_ids: Sequence[int],
    *,
    block_size: int = 4,
    num_layers: int = 1,
    mask_token_id: int | None = None,
) -> DFlashConfig:
    """A drafter shaped like the target's attention (HF Qwen3 config); mask = the last spare vocab row."""
    t = target_config
    return DFlashConfig(
        **attention_shape(t),
        num_layers=num_layers,
        block_size=block_size,
        mask_token_id=t.vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=tuple(layer_ids),
        num_target_layers=t.num_hidden_layers,
    )


class TinyTrainer:
    """Adam on a fresh (or given) drafter; `run(steps)` can be called repeatedly (global_step accumulates)."""

    def __init__(
        self,
        drafter: DFlashDrafter,
        data: Sequences,
        embed_tokens: Tensor,
        lm_head: Tensor,
        *,
        lr: float = 3e-3,
        anchors_per_sequence: int = 16,
        seed: int = 0,
    ) -> None:
        self.drafter = drafter
        self.data = data
        self.embed_tokens = embed_tokens.detach()
        self.lm_head = lm_head.detach()
        self.anchors_per_sequence = anchors_per_sequence
        self.optimizer = torch.optim.Adam(drafter.parameters(), lr=lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.global_step = 0

    def loss(self, index: int) -> Tensor:
        """The block-prediction loss at `anchors_per_sequence` random anchors of sequence `index`."""
        b = self.drafter.cfg.block_size
        ids, taps = self.data.token_ids[index], self.data.taps[index]
        high = ids.shape[0] - b + 1  # s in [1, T-B]: a full block of labels
        anchors = torch.randint(1, high, (self.anchors_per_sequence,), generator=self.generator)
        logits = block_logits(
            self.drafter,
            self.drafter.context_kv(taps),
            ids[anchors],
            anchors,
            self.embed_tokens,
            self.lm_head,
        )  # [m, B-1, V]
        labels = ids[anchors[:, None] + torch.arange(1, b)]  # [m, B-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def run(self, steps: int) -> float:
        """Train `steps` steps (one pass over all sequences each); returns the last step's mean loss."""
        self.drafter.train()
        last = float("nan")
        for _ in range(steps):
            self.optimizer.zero_grad()
            loss = torch.stack([self.loss(i) for i in range(len(self.data.token_ids))]).mean()
            loss.backward()
            self.optimizer.step()
            self.global_step += 1
            last = loss.item()
        self.drafter.eval()
        return last
