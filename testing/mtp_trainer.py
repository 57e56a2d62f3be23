"""Fine-tune a target's MTP head for a few hundred steps on cached states, and save it as an MTP-only
checkpoint (the target's config, the head's tensors under their published names).

Teacher forcing, as the head is trained and as the live loop fills its context: position t reads the
target's normed last layer h_t and token t+1, and learns token t+2 (cross-entropy through the target's
lm_head). For tests and the demo; not a training recipe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from eval_worker.families.mtp.drafter import MtpDrafter
from eval_worker.families.mtp.layouts import MtpLayout


def train_mtp_head(
    head: MtpDrafter,
    normed: Sequence[Tensor],
    token_ids: Sequence[Tensor],
    embed: Tensor,
    lm_head: Tensor,
    steps: int,
    lr: float = 1e-3,
) -> float:
    """`steps` Adam steps over the sequences in turn (normed last layer [T, H], token ids [T]); the last loss."""
    head.train()
    optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=lr)
    loss = torch.tensor(0.0)
    for step in range(steps):
        i = step % len(normed)
        out = head.prefill(normed[i], token_ids[i], embed).out  # [T-1, H]: position t predicts t+2
        loss = F.cross_entropy(out[:-1] @ lm_head.T, token_ids[i][2:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    head.eval()
    return float(loss.detach())


def published_state(head: MtpDrafter, layout: MtpLayout, num_layers: int) -> dict[str, Tensor]:
    """The head's tensors under the names the layout's checkpoints use, experts one by one."""
    renamed = {new: old for old, new in layout.parts.items()}
    block = layout.block_prefix(num_layers)
    out = {}
    for name, tensor in head.state_dict().items():
        part, rest = name.split(".", 1)
        if part != "block":
            out[layout.prefix(num_layers) + renamed[part] + "." + rest] = tensor.detach().contiguous().clone()
        elif rest.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out.update(_experts(block + rest, tensor.detach()))
        else:
            out[block + rest] = tensor.detach().contiguous().clone()
    return out


def _experts(key: str, stacked: Tensor) -> dict[str, Tensor]:
    """transformers' stacked `gate_up_proj` [E, 2I, H] or `down_proj` [E, H, I] -> per-expert weights."""
    stem, kind = key.rsplit(".", 1)
    out = {}
    for e, weight in enumerate(stacked):
        if kind == "down_proj":
            out[f"{stem}.{e}.down_proj.weight"] = weight.contiguous().clone()
        else:
            gate, up = weight.chunk(2)
            out[f"{stem}.{e}.gate_proj.weight"] = gate.contiguous().clone()
            out[f"{stem}.{e}.up_proj.weight"] = up.contiguous().clone()
    return out


def save_mtp_only(out_dir: Path, target_config: Mapping[str, Any], head: MtpDrafter, *, step: int) -> Path:
    """An MTP-only checkpoint: the target's config (as `config.json` holds it), the head's tensors, and the
    step in `trainer_state.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(dict(target_config), indent=1))
    num_layers = int(target_config["num_hidden_layers"])
    save_file(published_state(head, head.layout, num_layers), out_dir / "model.safetensors")
    (out_dir / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return out_dir
