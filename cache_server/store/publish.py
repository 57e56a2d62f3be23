"""The write half of the store's protocol, the same on a local disk and on object storage (which has
no atomic rename): write a prompt's new arrays under their final keys, then its manifest last
(`hierarchy.publish_manifest`). Until the manifest lists them, readers never see the arrays; a write
that fails (a full disk, say) deletes what it wrote of them."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, wait
from typing import TypeVar

import numpy as np
import torch

from cache_server.store import chunks, fp8, hierarchy
from cache_server.store.blobs import Blobs
from cache_server.store.errors import StoreInputError
from cache_server.store.manifest import layer_id
from cache_server.torch_utils import as_numpy, dtype_name
from schemas.storage import StorageName

log = logging.getLogger(__name__)
T = TypeVar("T")


def check_tokens(token_ids: np.ndarray, prompt_len: int) -> np.ndarray:
    """Token ids as contiguous little-endian int64, or StoreInputError for what can never be stored."""
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise StoreInputError(f"token_ids must be a non-empty 1-D int array, got {ids.dtype} {ids.shape}")
    if not 1 <= prompt_len <= ids.size:
        raise StoreInputError(f"prompt_len {prompt_len} outside [1, {ids.size}]")
    return np.ascontiguousarray(ids, dtype="<i8")


def stored_layers(
    layers: Mapping[int, torch.Tensor], shape: tuple[int, int], dtype: torch.dtype, storage: StorageName
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray] | None]:
    """The layers to write, by id in order, as `storage` keeps them: their exact bytes (in the zarr
    element type of `dtype`), or their FP8 bytes and per-token scales. StoreInputError unless each is a
    CPU tensor of `dtype` and `shape`, under an int id >= 0."""
    checked = {layer_id(k): t for k, t in layers.items()}
    if not checked:
        raise StoreInputError("write needs at least one layer")
    for k, t in checked.items():
        if t.dtype != dtype or t.device.type != "cpu" or tuple(t.shape) != shape:
            raise StoreInputError(
                f"layer {k}: expected a CPU {dtype} tensor of shape {list(shape)}, "
                f"got {t.device.type} {t.dtype} {list(t.shape)}"
            )
    if storage == "exact":
        element = chunks.storage_dtype(dtype_name(dtype))
        return {k: as_numpy(checked[k]).view(element) for k in sorted(checked)}, None
    quantized = {k: fp8.quantize(k, checked[k]) for k in sorted(checked)}
    return {k: q for k, (q, _) in quantized.items()}, {k: s for k, (_, s) in quantized.items()}


def write_array(blobs: Blobs, key: str, data: np.ndarray, *, compress: bool) -> int:
    """Write `data` as a Zarr array under `key` (chunks first, zarr.json last); the crc32 of its
    zarr.json, for the manifest."""
    meta, encoded = chunks.array_objects(data, compress=compress)
    for c, payload in enumerate(encoded):
        blobs.put(chunks.chunk_key(key, c, data.ndim), payload)
    blobs.put(f"{key}/{chunks.ZARR_JSON}", meta)
    return zlib.crc32(meta)


def put_prompt(
    blobs: Blobs,
    pool: Executor,
    prompt: str,
    layers: Mapping[int, np.ndarray],
    token_ids: np.ndarray | None,
    scales: Mapping[int, np.ndarray] | None = None,
) -> tuple[dict[int, int], dict[int, int] | None]:
    """Write a prompt's new layer arrays on `pool` (and an FP8 store's scales arrays beside them,
    uncompressed), and for a new prompt (`token_ids` given) its token ids; returns the crc32 of each
    layer's zarr.json, and of each scales array's. Nothing else under `prompt` is touched: its manifest,
    if another writer published one meanwhile, stands. If a write fails, every one of these arrays is
    deleted (once all the writes have ended) and its error raised: the layers published before stay."""
    arrays = {f"layers/{k}": (a, True) for k, a in layers.items()}
    arrays |= {f"scales/{k}": (a, False) for k, a in (scales or {}).items()}
    if token_ids is not None:
        arrays["token_ids"] = (token_ids, False)
    # One listing finds what interrupted writes left under the arrays about to be written.
    for key in {key for o in blobs.objects(prompt) for key in arrays if o.key.startswith(f"{prompt}/{key}/")}:
        blobs.delete(f"{prompt}/{key}")
    puts = {key: pool.submit(write_array, blobs, f"{prompt}/{key}", a, compress=c) for key, (a, c) in arrays.items()}
    wait(puts.values())  # a write still running would put back what the clean-up deletes
    failed = next((e for f in puts.values() if (e := f.exception()) is not None), None)
    if failed is not None:
        discard(blobs, prompt, arrays)
        raise failed
    crc32 = {key: f.result() for key, f in puts.items()}
    scale_crc32 = {k: crc32[f"scales/{k}"] for k in scales} if scales is not None else None
    return {k: crc32[f"layers/{k}"] for k in layers}, scale_crc32


def published_or_discarded(
    blobs: Blobs, prompt: str, crc32: Mapping[int, int], scale_crc32: Mapping[int, int] | None, publish: Callable[[], T]
) -> T:
    """`publish()`, the manifest's write after `put_prompt`'s arrays (their checksums given); if it fails
    (a full disk), what was written for it is deleted, as no manifest will list it: those arrays, or
    everything under a new prompt (`publish` without a manifest before). Not when another writer's
    manifest won a create race (FileExistsError): what it lists is under the same keys."""
    try:
        return publish()
    except FileExistsError:
        raise
    except OSError:
        if hierarchy.manifest_text(blobs, prompt) is None:
            blobs.delete(prompt)
        else:
            discard(blobs, prompt, [*(f"layers/{k}" for k in crc32), *(f"scales/{k}" for k in scale_crc32 or {})])
        raise


def discard(blobs: Blobs, prompt: str, arrays: Iterable[str]) -> None:
    """Delete these arrays of `prompt` (keys relative to it), which no manifest lists: all their objects,
    a local write's `.tmp` files among them. A failure is logged, not raised: the orphan sweep of a
    later start removes what is left."""
    for key in arrays:
        try:
            blobs.delete(f"{prompt}/{key}")
        except Exception as e:
            log.warning("could not delete %s/%s of a failed write: %s", prompt, key, e)
