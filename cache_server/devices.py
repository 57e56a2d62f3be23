"""Device and dtype choice shared by the server and the workers: bf16 on GPU, fp32 on CPU by default."""

from __future__ import annotations

import torch

from cache_server.dtypes import TORCH_DTYPES


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; asking for cuda without one is an error, not a fallback."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TORCH_DTYPES[dtype]
