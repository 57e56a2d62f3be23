"""The write side of an FP8 store (`schemas/storage.py` reads it back): one float32 scale per token,
the row's largest magnitude over e4m3's largest finite value, and the row divided by it, rounded to
nearest-even into float8_e4m3fn. The scales are a second array beside each layer (`scales/<k>`).
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import torch

from cache_server.store import chunks
from cache_server.store.blobs import Blobs
from cache_server.store.errors import StoreInputError
from schemas.fp8 import FP8_MAX


def quantize(layer: int, t: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A layer [T, H] as (uint8 [T, H] FP8 bit patterns, float32 [T, 1] scales); StoreInputError for
    non-finite values, which no scale represents (an exact store keeps them as they are)."""
    x = t.to(torch.float32)
    if not bool(torch.isfinite(x).all()):
        raise StoreInputError(f"layer {layer}: non-finite values cannot be stored as float8_e4m3fn")
    amax = x.abs().amax(dim=1, keepdim=True)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # an all-zero row: scale 1
    fp8 = (x / scales).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8.view(torch.uint8).numpy(), scales.numpy()


def read_scales(blobs: Blobs, array: str, zarr_json_crc32: int, num_tokens: int) -> np.ndarray:
    """A layer's scales (float32 [T], read-only) as `publish.put_prompt` wrote them (uncompressed
    chunks of `chunks.CHUNK_TOKENS` rows); ValueError or FileNotFoundError unless its zarr.json matches
    the manifest's checksum and every chunk its own."""
    meta = blobs.get(f"{array}/{chunks.ZARR_JSON}")
    if meta is None:
        raise FileNotFoundError(f"{array}: its zarr.json is missing")
    if zlib.crc32(meta) != zarr_json_crc32:
        raise ValueError(f"{array}: its zarr.json does not match the manifest's checksum")
    md = json.loads(meta)
    if md["shape"] != [num_tokens, 1] or md["data_type"] != "float32":
        raise ValueError(f"{array}: {md['data_type']} {md['shape']}, the manifest says float32 [{num_tokens}, 1]")
    parts = []
    for c, expected in enumerate(md["attributes"][chunks.CRC_ATTRIBUTE]):
        raw = blobs.get(chunks.chunk_key(array, c, 2))
        if raw is None or zlib.crc32(raw) != expected:
            raise ValueError(f"{array}: chunk {c} is {'missing' if raw is None else 'damaged'}")
        parts.append(np.frombuffer(raw, "<f4"))
    scales = np.concatenate(parts)[:num_tokens].astype(np.float32)
    if len(scales) != num_tokens:
        raise ValueError(f"{array}: {len(scales)} scales, the manifest says {num_tokens} tokens")
    scales.flags.writeable = False
    return scales
