"""Map the three stored element types between torch, numpy and zarr, always without copying.

Zarr 3.1 has no bfloat16, so bf16 layers are stored as their uint16 bit pattern and the real
dtype lives in the manifest. Every conversion here is a view: the bytes never change.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

# Manifest name (torch's name without "torch.") -> torch dtype.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
_NUMPY_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
}
# What zarr stores: same width, a dtype zarr 3.1 knows.
_STORAGE_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.bfloat16: np.dtype(np.uint16),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
}
# torch.from_numpy takes neither ml_dtypes.bfloat16 nor (in older releases) uint16: go through int16.
_TORCH_BRIDGE: dict[torch.dtype, np.dtype[Any]] = {
    torch.bfloat16: np.dtype(np.int16),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
}


def is_supported(dtype: torch.dtype) -> bool:
    return dtype in _NUMPY_DTYPES


def dtype_name(dtype: torch.dtype) -> str:
    """The manifest's spelling: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy element type callers see (ml_dtypes.bfloat16 for bf16)."""
    return _NUMPY_DTYPES[dtype]


def storage_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The element type of the zarr arrays (uint16 for bf16)."""
    return _STORAGE_DTYPES[dtype]


def tensor_to_storage(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array of its storage dtype, sharing memory when `t` is contiguous."""
    t = t.detach().contiguous()
    bridge = _TORCH_BRIDGE[t.dtype]
    as_numpy = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return as_numpy.view(bridge).view(_STORAGE_DTYPES[t.dtype])


def numpy_to_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Wrap an array of `numpy_dtype(dtype)` or `storage_dtype(dtype)` as a torch tensor, no copy."""
    if a.dtype.itemsize != _NUMPY_DTYPES[dtype].itemsize:
        raise ValueError(f"cannot view {a.dtype} as {dtype}")
    t = torch.from_numpy(a.view(_TORCH_BRIDGE[dtype]))
    return t.view(dtype) if dtype == torch.bfloat16 else t
