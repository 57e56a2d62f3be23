"""Run a HF causal LM and capture its taps under the project's layer convention.

Tap id k = output of decoder layer k (0-based), captured by a forward hook on
`model.model.layers[k]`, so the last layer is exact (HF's `hidden_states[-1]` is post-norm).
Used by the live loop, the tiny trainer and the tests; the cache server owns production capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class TargetPass:
    logits: Tensor  # [N, T, V]
    taps: Tensor  # [N, T, K*H], taps concatenated in `layer_ids` order


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"expected model.model.layers to be a ModuleList, got {type(layers).__name__}")
    return layers


@torch.no_grad()
def target_forward(model: nn.Module, input_ids: Tensor, layer_ids: Sequence[int]) -> TargetPass:
    """input_ids [N, T] -> logits and taps of every position (causal: position i sees tokens <= i)."""
    layers = decoder_layers(model)
    captured: dict[int, Tensor] = {}

    def hook_for(k: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            captured[k] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [layers[k].register_forward_hook(hook_for(k)) for k in sorted(set(layer_ids))]
    try:
        logits = model(input_ids=input_ids, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()
    return TargetPass(logits.float(), torch.cat([captured[k] for k in layer_ids], dim=-1).float())


@torch.no_grad()
def greedy_continuation(model: nn.Module, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """prompt + the target's greedy response of exactly `max_new_tokens` tokens (no early stop)."""
    ids, device = list(prompt_ids), next(model.parameters()).device
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids
