"""Between the wire's numpy arrays and the torch tensors tests compare against."""

from __future__ import annotations

import numpy as np
import torch

from cache_server.client.results import as_tensor
from cache_server.torch_utils import as_numpy
from schemas.safetensors_frame import parse


def parse_torch(body: bytes | bytearray | np.ndarray) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors body as torch tensors (views of a writable copy) and its metadata."""
    arrays, metadata = parse(bytearray(body) if isinstance(body, bytes) else body)
    return {name: as_tensor(a) for name, a in arrays.items()}, metadata


__all__ = ["as_numpy", "as_tensor", "parse_torch"]
