"""SpecForge 0.2's own offline data path over a directory of `.ckpt` files: run with the Python of the
peers' environment (`testing/peers.py`), never the project's.

- `python peer_specforge.py load ALGORITHM DIR OUT` reads DIR as `data.hidden_states_path` is read:
  the algorithm's offline reader (the sorted `*.ckpt` walk), `LocalFeatureStore`, its normalizer and
  collator, through `FeatureDataLoader` in file order (the eval loader's assembly: training's shuffles
  the same refs). Writes batch i's tensors to OUT (safetensors) as `i.KEY`; prints the files read, JSON.
- `python peer_specforge.py train-dflash TARGET DIR LAYERS` runs SpecForge's DFlash training step on
  CPU over those batches: its draft from its generated config for TARGET, with `target_layer_ids`
  LAYERS (comma-separated), `OnlineDFlashModel` (sdpa) and `DFlashTrainStrategy.forward_loss`, then
  backward and an AdamW step per batch. Prints the losses and how many draft tensors changed, JSON.

`specforge_batches` and `specforge_dflash_steps` run these from the project's environment.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

MASK_TOKEN_ID = 3
MAX_LEN = 2048
TTT_LENGTH = 7  # SpecForge's default; the EAGLE-3 normalizer does not read it


def batches(algorithm: str, features: Path) -> tuple[list[str], Iterator[Any]]:
    """The files SpecForge lists under `features`, and its loader's batches (`TrainBatch`) over them."""
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.launch import _make_offline_eval_data_factory

    registration = builtin_algorithm_registry().resolve(algorithm)
    refs = registration.providers.offline_for("text").build_reader(
        str(features), run_id="check", ttt_length=TTT_LENGTH, max_len=MAX_LEN
    )
    files = [ref.feature_store_uri.removeprefix("file://") for ref in refs.read()]
    loader = _make_offline_eval_data_factory(
        algorithm=registration,
        modality="text",
        hidden_states_path=str(features),
        run_id="check",
        batch_size=1,
        max_len=MAX_LEN,
        ttt_length=TTT_LENGTH,
        use_usp_preprocess=False,
        dataloader_num_workers=0,
    )()
    return files, iter(loader)


def load(algorithm: str, features: str, out: str) -> None:
    """Every batch SpecForge's loader makes of `features`, saved to `out`; prints the files it read."""
    from safetensors.torch import save_file

    files, loaded = batches(algorithm, Path(features))
    tensors = {f"{i}.{key}": t.contiguous() for i, batch in enumerate(loaded) for key, t in batch.tensors.items()}
    save_file(tensors, out)
    print(json.dumps(files))


def _dflash_draft(target: str, layers: list[int]) -> Any:
    """SpecForge's DFlash draft (1 layer) from the config its trainer generates for `target`."""
    from types import SimpleNamespace

    from specforge.algorithms.dflash.providers import algorithm_providers
    from specforge.modeling.auto import AutoDraftModel
    from specforge.training.model_loading import _apply_draft_overrides, _generate_draft_config

    model = SimpleNamespace(
        target_model_path=target,
        cache_dir=None,
        trust_remote_code=False,
        draft_num_hidden_layers=1,
        draft_block_size=4,
    )
    cfg = SimpleNamespace(model=model, training=SimpleNamespace(strategy="dflash"))
    draft_config = algorithm_providers().model.draft_config
    config = _generate_draft_config(cfg, draft_config)
    _apply_draft_overrides(cfg, config, draft_config)
    config.dflash_config = {**config.dflash_config, "target_layer_ids": layers, "mask_token_id": MASK_TOKEN_ID}
    return AutoDraftModel.from_config(config)


def train_dflash(target: str, features: str, layers: str) -> None:
    """One SpecForge DFlash training step per batch of `features`, on CPU; prints losses and changes."""
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead
    from specforge.training.strategies.base import DFlashTrainStrategy

    torch.manual_seed(0)
    draft = _dflash_draft(target, [int(k) for k in layers.split(",")])
    heads = TargetEmbeddingsAndHead.from_pretrained(target, device="cpu", dtype=torch.float32)
    model = OnlineDFlashModel(
        draft_model=draft,
        target_lm_head=heads.lm_head,
        target_embed_tokens=heads.embed_tokens,
        mask_token_id=MASK_TOKEN_ID,
        block_size=int(draft.block_size),
        attention_backend="sdpa",
    )
    strategy = DFlashTrainStrategy(model)
    trained = [p for p in strategy.trainable_module().parameters() if p.requires_grad]
    before = [p.detach().clone() for p in draft.parameters()]
    optimizer = torch.optim.AdamW(trained, lr=1e-3)
    losses = []
    for batch in batches("dflash", Path(features))[1]:
        step = strategy.forward_loss(batch)
        optimizer.zero_grad()
        step.loss.backward()
        optimizer.step()
        losses.append(float(step.loss))
    changed = sum(not torch.equal(b, p) for b, p in zip(before, draft.parameters(), strict=True))
    print(json.dumps({"losses": losses, "draft_tensors": len(before), "changed": changed}))


def _in_peers(*args: str | Path) -> str:
    """This script's last line of stdout, run with `args` in the peers' environment."""
    from testing.peers import run_in_peers  # the project's side only: the peers' Python never imports it

    return run_in_peers(Path(__file__), *args).strip().splitlines()[-1]


def specforge_batches(algorithm: str, features: Path, work: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The files SpecForge's `algorithm` reader lists under `features`, and its loader's batches (`i.KEY`)."""
    from safetensors.torch import load_file

    files = json.loads(_in_peers("load", algorithm, features, work / "batches.safetensors"))
    return files, load_file(work / "batches.safetensors")


def specforge_dflash_steps(target: Path, features: Path, layers: list[int]) -> dict[str, Any]:
    """SpecForge's DFlash training steps on `features` (`train-dflash`): losses, draft tensors, changed."""
    result: dict[str, Any] = json.loads(_in_peers("train-dflash", target, features, ",".join(map(str, layers))))
    return result


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {"load": load, "train-dflash": train_dflash}
    commands[command](*args)
