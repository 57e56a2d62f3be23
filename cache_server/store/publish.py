"""The write half of the store's protocol, the same on a local disk and on object storage (which has
no atomic rename): write a prompt's new arrays under their final keys, then its manifest last
(`hierarchy.publish_manifest`). Until the manifest lists them, readers never see the arrays."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from cache_server.store import chunks
from cache_server.store.blobs import Blobs
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


def write_array(blobs: Blobs, key: str, data: np.ndarray, *, compress: bool) -> int:
    """Write `data` as a Zarr array under `key` (chunks first, zarr.json last); the crc32 of its
    zarr.json, for the manifest."""
    meta, encoded = chunks.array_objects(data, compress=compress)
    for c, payload in enumerate(encoded):
        blobs.put(chunks.chunk_key(key, c, data.ndim), payload)
    blobs.put(f"{key}/{chunks.ZARR_JSON}", meta)
    return zlib.crc32(meta)


def put_prompt(
    blobs: Blobs, pool: Executor, prompt: str, layers: Mapping[int, np.ndarray], token_ids: np.ndarray | None
) -> dict[int, int]:
    """Write a prompt's new layer arrays on `pool`, and for a new prompt (`token_ids` given) its token
    ids; returns the crc32 of each layer's zarr.json. Nothing else under `prompt` is touched: its
    manifest, if another writer published one meanwhile, stands."""
    keys = {k: f"{prompt}/layers/{k}" for k in layers}
    tokens_key = f"{prompt}/token_ids"
    targets = [*keys.values(), tokens_key] if token_ids is not None else list(keys.values())
    # One listing finds what interrupted writes left under the arrays about to be written.
    for key in {key for o in blobs.objects(prompt) for key in targets if o.key.startswith(f"{key}/")}:
        blobs.delete(key)
    puts = {k: pool.submit(write_array, blobs, keys[k], a, compress=True) for k, a in layers.items()}
    if token_ids is not None:
        write_array(blobs, tokens_key, token_ids, compress=False)
    return {k: f.result() for k, f in puts.items()}
