"""Write drafter checkpoints with the peers' own libraries, for a tiny target: run with the Python of
the peers' environment (speculators 0.9, SpecForge 0.2; `testing/peers.py` builds it), never the
project's. `python peer_checkpoints.py write TARGET_DIR OUT_DIR` writes, each a HF directory:

- `speculators_eagle3/`: speculators' training CLI defaults (its draft config from the verifier, a
  sliding-window draft layer of 2048, default aux layers, a draft vocab of half the target's);
- `speculators_eagle3_window65/`: the same with a window of 65 positions, short enough to bite;
- `specforge_dflash/`, `specforge_dflash_no_mask/`: SpecForge's generated DFlash config (2 draft layers,
  its layer formula), with and without `dflash_config.mask_token_id`;
- `specforge_eagle3/`: SpecForge's generated EAGLE-3 config (draft vocab of half the target's, its
  default aux ids in `eagle_config`).

Weights are random (seeded), as a fresh trainer's are: the tests check how they are read, not a tau.
`python peer_checkpoints.py drafts CKPT IN OUT` runs speculators' own EAGLE-3 forward (one step) on
`hidden_states` [1, T, K*H] and `input_ids` [1, T] read from IN (safetensors), writing its greedy draft
ids per position to OUT: the ground truth for how this project reads that checkpoint.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

DRAFT_VOCAB_SHARE = 2  # a draft vocab of 1/2 of the target's
MASK_TOKEN_ID = 3


def _draft_vocab(vocab_size: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """A draft vocab of the target's first ids; d2t offsets (all 0) and the t2d mask."""
    size = vocab_size // DRAFT_VOCAB_SHARE
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[:size] = True
    return size, torch.zeros(size, dtype=torch.long), t2d


def speculators_eagle3(target: Path, out: Path, *, window: int = 2048) -> None:
    """What `speculators train` builds by default, saved with its `save_pretrained`."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from transformers import AutoConfig

    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(target),
        num_layers=1,
        draft_arch="llama",
        hidden_act=None,
        sliding_window=window,
        full_attention_indices=[],
    )
    size, d2t, t2d = _draft_vocab(AutoConfig.from_pretrained(target).vocab_size)
    model = Eagle3DraftModel.from_training_args(
        layer_config,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=size,
        norm_before_residual=True,
        ttt_steps=3,
        verifier_name_or_path=str(target),
        draft_attn_impl="sdpa",
    )
    model.save_pretrained(out)


def _specforge_config(target: Path, algorithm: str, layers: int) -> Any:
    """SpecForge's draft config generated from the target, as its trainer makes it."""
    from importlib import import_module

    from specforge.training.model_loading import _apply_draft_overrides, _generate_draft_config

    providers = import_module(f"specforge.algorithms.{algorithm}.providers").algorithm_providers()
    model = SimpleNamespace(
        target_model_path=str(target),
        cache_dir=None,
        trust_remote_code=False,
        draft_num_hidden_layers=layers,
        draft_block_size=None,
    )
    cfg = SimpleNamespace(model=model, training=SimpleNamespace(strategy=algorithm))
    config = _generate_draft_config(cfg, providers.model.draft_config)
    _apply_draft_overrides(cfg, config, providers.model.draft_config)
    return config


def specforge_dflash(target: Path, out: Path, *, mask_token_id: int | None) -> None:
    """SpecForge's DFlash draft model from its generated config, saved with `save_pretrained`."""
    from specforge.modeling.auto import AutoDraftModel

    config = _specforge_config(target, "dflash", 2)
    if mask_token_id is not None:
        config.dflash_config = {**config.dflash_config, "mask_token_id": mask_token_id}
    AutoDraftModel.from_config(config).save_pretrained(out)


def specforge_eagle3(target: Path, out: Path) -> None:
    """SpecForge's EAGLE-3 draft model (half the vocab, its default aux ids), saved with `save_pretrained`."""
    from specforge.modeling.auto import AutoDraftModel

    config = _specforge_config(target, "eagle3", 1)
    size, d2t, t2d = _draft_vocab(config.vocab_size)
    config.draft_vocab_size = size
    model = AutoDraftModel.from_config(config)
    model.d2t.copy_(d2t)
    model.t2d.copy_(t2d)
    model.save_pretrained(out)


def speculators_drafts(checkpoint: Path, inputs: Path, out: Path) -> None:
    """speculators' greedy first-step draft ids (draft vocab) at every position, with eager attention."""
    from safetensors.torch import load_file, save_file
    from speculators.models.attention import create_float_mask
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(checkpoint).eval()
    model.config.transformer_layer_config._attn_implementation = "eager"  # dense masks on CPU
    model._attn_impl, model._create_mask_fn = "eager", create_float_mask
    batch = load_file(inputs)
    ids = batch["input_ids"]
    with torch.no_grad():
        drafts = model(batch["hidden_states"], ids, torch.zeros_like(ids), ttt_steps=1)
    save_file({"draft_ids": drafts[0].contiguous()}, out)


def write(target: Path, out: Path) -> None:
    """Every checkpoint above, into `out`; prints their names as JSON."""
    torch.manual_seed(0)
    writers = {
        "speculators_eagle3": lambda p: speculators_eagle3(target, p),
        "speculators_eagle3_window65": lambda p: speculators_eagle3(target, p, window=65),
        "specforge_dflash": lambda p: specforge_dflash(target, p, mask_token_id=MASK_TOKEN_ID),
        "specforge_dflash_no_mask": lambda p: specforge_dflash(target, p, mask_token_id=None),
        "specforge_eagle3": lambda p: specforge_eagle3(target, p),
    }
    for name, writer in writers.items():
        writer(out / name)
    print(json.dumps(sorted(writers)))


if __name__ == "__main__":
    command, *paths = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {"write": write, "drafts": speculators_drafts}
    commands[command](*map(Path, paths))
