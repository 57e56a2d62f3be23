"""An FP8 store's values (`storage.py`): float8_e4m3fn bit patterns times one float32 scale per token.

Dequantization lives here, in numpy, so the server (safetensors bodies) and the light client (pieces
bodies) turn the same stored bytes into the same values, bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
# Every float8_e4m3fn bit pattern's value as float32 (exact: e4m3 values are float32 values).
_FP8_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
_BLOCK_ELEMENTS = 1 << 16  # float32 values dequantized at a time (256 KiB: stays in cache)


def dequantize(fp8: np.ndarray, scales: np.ndarray, out: np.ndarray) -> None:
    """Fill `out` ([n, H] of the target's numpy dtype, a strided view is fine) with `fp8` ([n, H] uint8
    bit patterns) times `scales` ([n] float32): the value in float32, rounded once to `out`'s dtype."""
    if fp8.shape != out.shape or scales.shape != (fp8.shape[0],):
        raise ValueError(f"fp8 {fp8.shape}, scales {scales.shape} and out {out.shape} do not match")
    rows = max(1, _BLOCK_ELEMENTS // max(1, fp8.shape[1]))
    values = np.empty((min(rows, fp8.shape[0]), fp8.shape[1]), np.float32)
    scales = scales.astype(np.float32, copy=False)
    for lo in range(0, fp8.shape[0], rows):  # in blocks that stay in cache (3x faster than whole layers)
        hi = min(lo + rows, fp8.shape[0])
        block = values[: hi - lo]
        np.take(_FP8_VALUES, fp8[lo:hi], out=block, mode="clip")  # uint8 indexes: never out of range
        block *= scales[lo:hi, None]
        out[lo:hi] = block
