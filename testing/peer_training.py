"""speculators' EAGLE-3 training fed two ways from one cache: run with the Python of the peers' environment
(speculators 0.9), never the project's, with this repository on PYTHONPATH.

`python peer_training.py SERVER TARGET_DIR WORK_DIR SET_NAME STEPS` reads the set's samples from the cache
server at the aux layers speculators' own EAGLE-3 model asks for (its default ids for TARGET_DIR), then:
(a) writes them as speculators' offline data (`hs_{i}.safetensors` beside its Arrow dataset, built by its
own preprocessing, row i = the set's prompt i) and reads them back with its `ArrowDataset`; (b) reads
them with this project's `CacheDataset`. Each goes through speculators' `_setup_dataloader` with
`shift_batch` (packed, spawned workers) into STEPS optimizer steps of a fresh model from one seed.
Prints JSON: the aux ids, and per path the per-step losses and packed tokens.

speculators' `Trainer` cannot run on a CPU (`setup_model` moves the model to `local_rank`, an accelerator
index; `train_epoch` casts under CUDA autocast and its step timer synchronizes the accelerator), so
`train_steps` drives each step as `Trainer.train_epoch` does: the batch dict into the model with the
trainer's call kwargs, its loss backward, gradient clipping at 1.0, and its optimizers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from safetensors.torch import save_file
from speculators.data_generation.preprocessing import build_speculator_training_dataset
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.models.eagle3.data import shift_batch
from speculators.train.cli import create_transformer_layer_config, set_seed
from speculators.train.data import ArrowDataset, BaseDataset
from speculators.train.dataloader import _setup_dataloader
from speculators.train.optimizers import build_optimizers
from speculators.train.recovery import BatchRecoveryCoordinator
from speculators.train.trainer import TrainerConfig

from cache_server.client import CacheClient
from cache_server.client.speculators_dataset import CacheDataset
from cache_server.client.torch_dataset import HiddenStatesDataset

SEED = 0
TOTAL_SEQ_LEN = 40  # a few short samples per packed row (speculators' default 8192 would take them all)
# DataLoader workers per path: the cache path's are spawned, as speculators starts them, each with its own client
WORKERS = {"arrow": 0, "cache": 2}
DTYPE = torch.bfloat16  # speculators' default hidden_states_dtype (loader buffers and autocast)


def build_model(target: Path) -> Eagle3DraftModel:
    """speculators' EAGLE-3 draft from its training defaults for `target` (one draft layer, its default
    aux ids, the verifier's embeddings, lm_head and norm), with attention that runs on a CPU."""
    layer_config = create_transformer_layer_config(
        verifier_name_or_path=str(target),
        num_layers=1,
        draft_arch="llama",
        hidden_act=None,
        sliding_window=2048,
        full_attention_indices=[],
    )
    return Eagle3DraftModel.from_training_args(
        layer_config,
        draft_vocab_size=layer_config.vocab_size,  # full vocab: no d2t/t2d
        norm_before_residual=True,
        ttt_steps=3,
        verifier_name_or_path=str(target),
        draft_attn_impl="sdpa",  # flex attention needs a GPU
    )


def write_offline(samples: HiddenStatesDataset, out: Path) -> None:
    """The samples as speculators' offline data: its preprocessing's Arrow dataset of pre-tokenized rows
    (`input_ids`, `loss_mask`, `seq_len`), and `hidden_states/hs_{i}.safetensors` holding row i's
    `hidden_states` [T, aux + 1, H] (aux layers, then the last) and `token_ids` [T]."""
    rows: dict[str, list[list[int]]] = {"input_ids": [], "loss_mask": []}
    states = []
    with CacheClient(samples.server) as client:
        for prompt_id in samples.prompt_ids:
            sample = samples.sample_of(client, prompt_id)
            last = sample["verifier_last_hidden_states"]  # [T, H]
            aux = sample["hidden_states"].reshape(last.shape[0], -1, last.shape[1])  # [T, aux, H]
            states.append({"hidden_states": torch.cat([aux, last[:, None]], 1), "token_ids": sample["input_ids"]})
            rows["input_ids"].append(sample["input_ids"].tolist())
            rows["loss_mask"].append(sample["loss_mask"].tolist())
    # its own preprocessing of speculator-format rows; no shuffle, so row i stays the set's prompt i
    table = build_speculator_training_dataset(Dataset.from_dict(rows), processor=None, num_proc=1)
    table.save_to_disk(str(out))
    (out / "hidden_states").mkdir()
    for i, tensors in enumerate(states):
        save_file(tensors, out / "hidden_states" / f"hs_{i}.safetensors")


def train_steps(dataset: BaseDataset, target: Path, steps: int, save_path: Path, workers: int) -> dict[str, list[Any]]:
    """`steps` optimizer steps of a fresh model (seeded) on `dataset` through speculators' loader, each
    as `Trainer.train_epoch` takes one; the per-step losses and the tokens packed into each step.
    Workers change where a sample is read, not what a batch holds."""
    set_seed(SEED)
    model = build_model(target)
    loader = _setup_dataloader(
        dataset,
        TOTAL_SEQ_LEN,
        model.config.transformer_layer_config.hidden_size,
        num_workers=workers,
        num_target_layers=len(model.target_layer_ids),
        preprocess=shift_batch,
        seed=SEED,
    )
    call_kwargs, _ = Eagle3DraftModel.get_trainer_kwargs(
        loss_fn="kl_div", loss_implementation="eager", ttt_steps=3, ttt_step_loss_decay=1.0
    )  # the fused loss is a Triton kernel
    config = TrainerConfig(lr=1e-3, num_epochs=1, save_path=str(save_path), train_call_kwargs=call_kwargs)
    optimizers = build_optimizers(model, config)
    model.train()
    loader.batch_sampler.set_epoch(0)
    recovery = BatchRecoveryCoordinator("training")
    losses, tokens = [], []
    for batch in loader:
        recovery.consume(batch)
        batch = {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        with torch.autocast("cpu", dtype=DTYPE):
            _, loss, _ = model(**batch, **call_kwargs)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        losses.append(loss.item())
        tokens.append(batch["input_ids"][batch["document_ids"] != -1].tolist())
        if len(losses) == steps:
            break
    return {"losses": losses, "tokens": tokens}


def same_samples(a: BaseDataset, b: BaseDataset) -> bool:
    """Whether the two datasets hold the same samples, index for index: keys, dtypes and values."""
    if len(a) != len(b):
        return False
    for i in range(len(a)):
        x, y = a[i], b[i]
        if x.keys() != y.keys() or any(x[k].dtype != y[k].dtype or not torch.equal(x[k], y[k]) for k in x):
            return False
    return True


def main(server: str, target: Path, work: Path, set_name: str, steps: int) -> None:
    """Both paths, printed as one JSON line."""
    layers = build_model(target).target_layer_ids  # its default aux ids: HF hidden_states indices
    samples = HiddenStatesDataset(
        server, layers=layers, layer_convention="hf_index", set_name=set_name, format="speculators"
    )
    write_offline(samples, work / "offline")
    arrow = ArrowDataset(
        max_len=TOTAL_SEQ_LEN, datapath=work / "offline", on_missing="raise", hidden_states_dtype=DTYPE
    )
    cache = CacheDataset(server, layers=layers, set_name=set_name, max_len=TOTAL_SEQ_LEN, hidden_states_dtype=DTYPE)
    result = {
        "layers": list(layers),
        "approx_lengths": {"arrow": arrow.approx_lengths, "cache": cache.approx_lengths},
        # read here first: the cache path's workers then receive a dataset whose client is open
        "same_samples": same_samples(arrow, cache),
        "arrow": train_steps(arrow, target, steps, work / "ckpt-arrow", WORKERS["arrow"]),
        "cache": train_steps(cache, target, steps, work / "ckpt-cache", WORKERS["cache"]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    server_url, target_dir, work_dir, set_arg, steps_arg = sys.argv[1:]
    main(server_url, Path(target_dir), Path(work_dir), set_arg, int(steps_arg))
