"""How a store keeps hidden states: `exact` (the target dtype's own bytes, losslessly compressed; the
default) or `float8_e4m3fn` (each row of a layer as FP8 e4m3 times one float32 scale per token, half
the bytes of bf16). An FP8 store lives in its own namespace (the storage is part of the target's
fingerprint) and says so in every `/hidden` body and every eval report.

Names only (command lines import them before any heavy module); the values are `fp8.py`'s.
"""

from __future__ import annotations

from typing import Literal, get_args

StorageName = Literal["exact", "float8_e4m3fn"]
STORAGE_NAMES: tuple[StorageName, ...] = get_args(StorageName)


def describe_storage(name: StorageName) -> str:
    """What a body's and a report's `storage` says: `exact`, or `float8_e4m3fn per-token scale`."""
    return "exact" if name == "exact" else f"{name} per-token scale"


def bytes_per_token(name: StorageName, hidden_size: int, dtype_bytes: int) -> int:
    """Uncompressed bytes one token of one layer takes: H elements of the target dtype, or H FP8 bytes
    and a float32 scale."""
    return hidden_size * dtype_bytes if name == "exact" else hidden_size + 4
