"""safetensors framing without copies: build a body whose tensor regions are filled in place,
and parse one into zero-copy views.

Layout (safetensors spec): 8-byte little-endian header length, JSON header padded with spaces to
8 bytes, then the tensors' raw bytes back to back.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
_TORCH_BY_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}


class WireFormatError(ValueError):
    """A body that is not the safetensors layout it claims to be."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class FramedBody:
    """One uninitialised buffer holding the whole body, and a byte view of each tensor's region."""

    buffer: np.ndarray  # uint8 [total]
    regions: dict[str, np.ndarray]  # name -> uint8 view into buffer

    def as_memoryview(self) -> memoryview:
        return memoryview(self.buffer.data)


def frame(specs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> FramedBody:
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": SAFETENSORS_DTYPES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    buffer = np.empty(start + offset, dtype=np.uint8)  # no zero-fill: every byte is written below
    buffer[:8] = np.frombuffer(struct.pack("<Q", len(raw)), dtype=np.uint8)
    buffer[8:start] = np.frombuffer(raw, dtype=np.uint8)
    regions = {}
    for spec in specs:
        lo, hi = header[spec.name]["data_offsets"]  # type: ignore[index]
        regions[spec.name] = buffer[start + lo : start + hi]
    return FramedBody(buffer=buffer, regions=regions)


def parse(body: bytes | bytearray | memoryview | np.ndarray) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors as views of `body` (which must stay alive and writable for torch) plus metadata."""
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
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        lo, hi = entry["data_offsets"]
        dtype = _TORCH_BY_SAFETENSORS.get(entry["dtype"])
        if dtype is None or hi > len(data):
            raise WireFormatError(f"tensor {name!r}: unsupported dtype {entry['dtype']} or range past the body")
        flat = torch.frombuffer(data[lo:hi], dtype=dtype) if hi > lo else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors, metadata
