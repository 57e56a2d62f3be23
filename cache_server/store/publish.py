"""The write half of the store's protocol: stage a prompt's new arrays aside, make them durable, then
rename them into the prompt's directory. The caller writes the manifest last (`chunks.replace_file`),
and only a manifest makes a prompt or a layer visible."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cache_server.store import chunks
from cache_server.store.manifest import StoreInputError
from cache_server.torch_utils import as_numpy


def check_tokens(token_ids: np.ndarray, prompt_len: int) -> np.ndarray:
    """Token ids as contiguous little-endian int64, or StoreInputError for what can never be stored."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise StoreInputError(f"token_ids must be a non-empty 1-D int array, got {ids.dtype} {ids.shape}")
    if not 1 <= prompt_len <= ids.size:
        raise StoreInputError(f"prompt_len {prompt_len} outside [1, {ids.size}]")
    return np.ascontiguousarray(ids, dtype="<i8")


def layer_bytes(
    layer: int, t: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype, storage: np.dtype[Any]
) -> np.ndarray:
    """A layer to store as its exact bytes in the storage dtype; StoreInputError unless it is a CPU
    tensor of `dtype` and `shape`."""
    if t.dtype != dtype or t.device.type != "cpu" or tuple(t.shape) != shape:
        raise StoreInputError(
            f"layer {layer}: expected a CPU {dtype} tensor of shape {list(shape)}, "
            f"got {t.device.type} {t.dtype} {list(t.shape)}"
        )
    return as_numpy(t).view(storage)


def stage(staging: Path, layers: Mapping[int, np.ndarray], ids: np.ndarray | None) -> None:
    """Write the new layer arrays (and the token ids of a new prompt) under `staging`, durably."""
    for k, a in layers.items():
        chunks.write_array(staging / "layers" / str(k), a, compress=True)
    if ids is not None:
        chunks.write_array(staging / "token_ids", ids, compress=False)
    chunks.fsync_tree(staging)


def move_in(prompts: Path, prompt_id: str, staging: Path, *, new_prompt: bool, layers: Iterable[int]) -> Path:
    """Rename staged arrays into `prompts/prompt_id` and fsync the directories; returns that directory."""
    prompt_dir = prompts / prompt_id
    if new_prompt:
        # A prompt dir without a manifest is an interrupted write: never published, safe to drop.
        shutil.rmtree(prompt_dir, ignore_errors=True)
        (prompt_dir / "layers").mkdir(parents=True)
        os.rename(staging / "token_ids", prompt_dir / "token_ids")
    for k in layers:
        dest = prompt_dir / "layers" / str(k)
        shutil.rmtree(dest, ignore_errors=True)  # unlisted leftover of an interrupted add
        os.rename(staging / "layers" / str(k), dest)
    for d in (prompt_dir / "layers", prompt_dir, prompts):
        chunks.fsync_dir(d)
    return prompt_dir
