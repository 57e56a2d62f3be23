"""Run a HF causal LM in-process and take its taps with the server's own capture hooks
(`cache_server.capture.hooks`): the live loop, the tiny trainer and the tests read the very layers
the cache serves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cache_server.capture.hooks import capture_decoder_outputs


@dataclass(frozen=True)
class TargetPass:
    """One in-process forward of the target: its logits and the taps a drafter reads."""

    logits: Tensor  # [N, T, V]
    taps: Tensor  # [N, T, K*H], taps concatenated in `layer_ids` order


@torch.no_grad()
def target_forward(model: nn.Module, input_ids: Tensor, layer_ids: Sequence[int]) -> TargetPass:
    """input_ids [N, T] -> logits and taps of every position (causal: position i sees tokens <= i)."""
    with capture_decoder_outputs(model, layer_ids) as captured:
        logits = model(input_ids=input_ids, use_cache=False).logits
    return TargetPass(logits.float(), torch.cat([captured[k] for k in layer_ids], dim=-1).float())


@torch.no_grad()
def greedy_continuation(model: nn.Module, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """prompt + the target's greedy response of exactly `max_new_tokens` tokens (no early stop)."""
    ids, device = list(prompt_ids), next(model.parameters()).device
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids
