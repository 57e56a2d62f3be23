"""Ground truth for served states: a direct transformers forward, independent of the server code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def direct_layer_outputs(
    model_dir: Path, token_ids: Sequence[int], dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Per decoder layer k, its output [T, H]: hidden_states[k + 1], and a hook for the last layer
    (HF's last hidden_states entry is after the final norm)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    last: dict[str, torch.Tensor] = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, out: last.__setitem__("h", out[0] if isinstance(out, tuple) else out)
    )
    with torch.inference_mode():
        out = model(torch.tensor([list(token_ids)]), output_hidden_states=True)
    handle.remove()
    n = model.config.num_hidden_layers
    layers = [out.hidden_states[k + 1][0] for k in range(n - 1)]
    layers.append(last["h"][0])
    return layers
