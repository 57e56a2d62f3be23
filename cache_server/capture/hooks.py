"""The project's layer convention, implemented once: layer id k is the output of decoder layer k
(0-based), taken by a forward hook on `model.model.layers[k]`. So the last layer is its raw output,
not HF's final-normed `hidden_states[-1]`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """A HF causal LM's decoder layers (`model.model.layers`); TypeError for any other shape."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"expected model.model.layers to be a ModuleList, got {type(layers).__name__}")
    return layers


@contextmanager
def capture_decoder_outputs(
    model: nn.Module, layer_ids: Sequence[int], *, to_host: bool = False
) -> Iterator[dict[int, torch.Tensor]]:
    """While open, each forward fills `{k: output of decoder layer k [N, T, H]}` for k in `layer_ids`.

    `to_host` copies each output to the CPU as it is produced (a copy on CPU too, so that no stored
    state aliases the model's memory); otherwise the outputs stay where the model left them."""
    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}

    def hook_for(k: int) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            captured[k] = hidden.detach().to("cpu", copy=True) if to_host else hidden

        return hook

    handles = [layers[k].register_forward_hook(hook_for(k)) for k in sorted(set(layer_ids))]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
