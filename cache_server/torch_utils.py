"""torch's side of the dtype and device names in `schemas.dtypes`, shared by server and workers.

bf16 on GPU and fp32 on CPU by default; asking for CUDA without one is an error, never a fallback.
"""

from __future__ import annotations

import numpy as np
import torch

from schemas.dtypes import DTYPE_NAMES
from schemas.safetensors_frame import numpy_dtype

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire's spelling: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a CUDA device raises ValueError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """A dtype name, or None for the default: bf16 on GPU, fp32 on CPU."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return TORCH_DTYPES[dtype]


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """A final RMSNorm as transformers computes each kind: x / sqrt(mean(x^2) + eps) in fp32, then the plain
    norm (`weight * x`) casts back to the input dtype before the weight, the zero-centred one
    (`(1 + weight) * x`: Qwen3-Next, Qwen3.5) multiplies in fp32 and casts back after."""
    x = hidden.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    weight = weight.to(hidden.device)
    if zero_centered:
        return (x * (1.0 + weight.float())).to(hidden.dtype)
    return weight * x.to(hidden.dtype)


def as_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array's exact bytes as a tensor sharing its memory (`as_numpy`'s inverse; the array must be
    writeable, as torch.from_numpy aliases it)."""
    if array.dtype == numpy_dtype("bfloat16"):  # torch takes no ml_dtypes array: via its bit pattern
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's exact bytes as a numpy array (ml_dtypes.bfloat16 for bf16), without a copy
    when it is contiguous."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: go through the bit pattern
        return t.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return t.numpy()
