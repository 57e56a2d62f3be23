"""safetensors framing without copies, on numpy: build a body whose tensor regions are filled in
place, and parse one into zero-copy views.

Layout (safetensors spec): 8-byte little-endian header length, JSON header padded with spaces to
8 bytes, then the tensors' raw bytes back to back. bf16 is `ml_dtypes.bfloat16`; torch callers wrap
the arrays with `torch.from_numpy` (see `HiddenResult.to_torch`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

_BY_NAME: dict[str, np.dtype[Any]] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "I64": np.dtype(np.int64),
}
_NAME_OF = {dtype: name for name, dtype in _BY_NAME.items()}
_BY_DTYPE_NAME = {"bfloat16": _BY_NAME["BF16"], "float16": _BY_NAME["F16"], "float32": _BY_NAME["F32"]}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy element type of a dtype name of `schemas.dtypes` (ml_dtypes.bfloat16 for bf16)."""
    return _BY_DTYPE_NAME[name]


class WireFormatError(ValueError):
    """A body that is not the safetensors layout it claims to be."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a body to frame: name, element type and shape."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the tensor's bytes in the body."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class FramedBody:
    """One uninitialised buffer holding the whole body, and a byte view of each tensor's region."""

    buffer: np.ndarray  # uint8 [total]
    regions: dict[str, np.ndarray]  # name -> uint8 view into buffer

    def as_memoryview(self) -> memoryview:
        """The whole body, for a response."""
        return memoryview(self.buffer.data)


def frame_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The bytes before the tensors (length + padded JSON header), and each tensor's [lo, hi) after them:
    the tensors follow back to back in `specs` order."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offsets: dict[str, tuple[int, int]] = {}
    offset = 0
    for spec in specs:
        if spec.dtype not in _NAME_OF:
            raise WireFormatError(f"tensor {spec.name!r}: dtype {spec.dtype} has no safetensors name here")
        offsets[spec.name] = (offset, offset + spec.nbytes)
        header[spec.name] = {
            "dtype": _NAME_OF[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [*offsets[spec.name]],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offsets


def frame(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> FramedBody:
    """A body with the header written and every tensor region left for the caller to fill."""
    head, offsets = frame_header(specs, metadata)
    start = len(head)
    total = start + max((hi for _, hi in offsets.values()), default=0)
    buffer = np.empty(total, dtype=np.uint8)  # no zero-fill: every byte is written by the caller
    buffer[:start] = np.frombuffer(head, dtype=np.uint8)
    regions = {name: buffer[start + lo : start + hi] for name, (lo, hi) in offsets.items()}
    return FramedBody(buffer=buffer, regions=regions)


def parse(body: bytes | bytearray | memoryview | np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors as numpy views of `body` (which must stay alive) plus the metadata strings."""
    view = memoryview(body.data if isinstance(body, np.ndarray) else body).cast("B")
    if len(view) < 8:
        raise WireFormatError("body shorter than a safetensors header")
    (hlen,) = struct.unpack("<Q", view[:8])
    if 8 + hlen > len(view):
        raise WireFormatError(f"safetensors header length {hlen} exceeds the body ({len(view)} bytes)")
    try:
        header = json.loads(bytes(view[8 : 8 + hlen]))
    except json.JSONDecodeError as e:
        raise WireFormatError(f"safetensors header is not JSON: {e}") from e
    metadata = header.pop("__metadata__", {}) or {}
    data = view[8 + hlen :]
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        lo, hi = entry["data_offsets"]
        dtype = _BY_NAME.get(entry["dtype"])
        if dtype is None or not 0 <= lo <= hi <= len(data):
            raise WireFormatError(f"tensor {name!r}: unsupported dtype {entry['dtype']} or range past the body")
        flat = np.frombuffer(data[lo:hi], dtype=dtype)
        try:
            tensors[name] = flat.reshape(entry["shape"])
        except ValueError as e:
            raise WireFormatError(f"tensor {name!r}: {hi - lo} bytes do not make shape {entry['shape']}") from e
    return tensors, metadata
