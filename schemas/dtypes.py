"""Element types and devices by name: the one list of what may be stored, served and asked for.

Names are torch's without the `torch.` prefix. Their numpy side is `safetensors_frame.numpy_dtype`,
their torch side `cache_server.torch_utils`.
"""

from __future__ import annotations

from typing import Literal, get_args

DTypeName = Literal["bfloat16", "float16", "float32"]
DeviceName = Literal["auto", "cpu", "cuda"]
DTYPE_NAMES: tuple[DTypeName, ...] = get_args(DTypeName)
DTYPE_BYTES: dict[DTypeName, int] = {"bfloat16": 2, "float16": 2, "float32": 4}  # one element, as stored
