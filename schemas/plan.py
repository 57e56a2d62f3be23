"""What a capture will store, projected before any byte is written: `cache-server plan`, `GET /plan`,
and the check that refuses a registration its local store has no room for."""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from schemas.dtypes import DTYPE_BYTES, DTypeName
from schemas.storage import StorageName, bytes_per_token

# Blosc zstd-1 with byte shuffle on bf16 activations, and on the same activations as FP8 + scales
# (bench/codec_choice.py): used until the store holds prompts of its own target to measure.
DOCUMENTED_RATIOS: dict[StorageName, tuple[float, str]] = {
    "exact": (1.45, "documented (bench/codec_choice.py: Blosc zstd-1, byte shuffle, bf16 activations)"),
    "float8_e4m3fn": (1.16, "documented (bench/codec_choice.py: Blosc zstd-1 on FP8 activations and scales)"),
}


class StoragePlan(BaseModel):
    """Projected bytes of `tokens` tokens over `prompts` prompts, for every layer and for the layers
    the server captures, after the codec; and the store's free space."""

    model_config = ConfigDict(extra="forbid")
    target: str
    num_layers: int
    hidden_size: int
    dtype: DTypeName
    storage: StorageName = "exact"
    capture_layers: list[int]
    prompts: int
    tokens: int = Field(description="tokens in all, prompt and response, over every prompt")
    bytes_per_token_per_layer: int = Field(
        description="uncompressed: hidden_size x the dtype's bytes (FP8: hidden_size + a 4-byte scale)"
    )
    codec_ratio: float = Field(description="uncompressed bytes per stored byte")
    codec_ratio_source: str
    all_layers_bytes: int
    capture_layers_bytes: int
    free_bytes: int | None = Field(description="free space under a local store; None: object storage, or no store")

    @classmethod
    # keyword-only: every number a plan is projected from, named
    def project(  # noqa: PLR0913
        cls,
        *,
        target: str,
        num_layers: int,
        hidden_size: int,
        dtype: DTypeName,
        capture_layers: list[int],
        prompts: int,
        tokens: int,
        storage: StorageName = "exact",
        codec_ratio: float | None = None,
        codec_ratio_source: str | None = None,
        free_bytes: int | None = None,
    ) -> StoragePlan:
        """The plan of `tokens` tokens over `prompts` prompts (codec ratio: the storage's documented one
        unless given)."""
        if codec_ratio is None:
            codec_ratio, codec_ratio_source = DOCUMENTED_RATIOS[storage]
        per_layer = bytes_per_token(storage, hidden_size, DTYPE_BYTES[dtype])
        return cls(
            target=target,
            num_layers=num_layers,
            hidden_size=hidden_size,
            dtype=dtype,
            storage=storage,
            capture_layers=capture_layers,
            prompts=prompts,
            tokens=tokens,
            bytes_per_token_per_layer=per_layer,
            codec_ratio=codec_ratio,
            codec_ratio_source=codec_ratio_source or "given",
            all_layers_bytes=math.ceil(tokens * per_layer * num_layers / codec_ratio),
            capture_layers_bytes=math.ceil(tokens * per_layer * len(capture_layers) / codec_ratio),
            free_bytes=free_bytes,
        )

    def for_load(self, prompts: int, tokens: int) -> StoragePlan:
        """The same target, codec ratio and free space for another number of prompts and tokens."""
        fixed = {"target", "num_layers", "hidden_size", "dtype", "storage", "capture_layers"}
        fixed |= {"codec_ratio", "codec_ratio_source"}
        return StoragePlan.project(
            **self.model_dump(include=fixed), prompts=prompts, tokens=tokens, free_bytes=self.free_bytes
        )

    @property
    def fits(self) -> bool | None:
        """Whether the capture layers fit the free space (None: the free space is not known)."""
        return None if self.free_bytes is None else self.capture_layers_bytes <= self.free_bytes

    def lines(self) -> list[str]:
        """The plan for a terminal."""
        per_token = self.bytes_per_token_per_layer * self.num_layers
        free = (
            "not known (object storage, or no local store named)" if self.free_bytes is None else _size(self.free_bytes)
        )
        verdict = {None: "", True: " (fits)", False: " (does NOT fit)"}[self.fits]
        return [
            f"target             {self.target}: {self.num_layers} layers x hidden {self.hidden_size}, {self.dtype}"
            + ("" if self.storage == "exact" else f", stored as {self.storage} + per-token scales"),
            f"per token          {_size(self.bytes_per_token_per_layer)} per layer, {_size(per_token)} for all layers",
            f"codec ratio        {self.codec_ratio:.2f}x, {self.codec_ratio_source}",
            f"prompts            {self.prompts}, {self.tokens} tokens in all",
            f"all layers         {_size(self.all_layers_bytes)} ({self.all_layers_bytes} bytes)",
            f"capture layers     {_size(self.capture_layers_bytes)} ({self.capture_layers_bytes} bytes, "
            f"{len(self.capture_layers)} layers)",
            f"free space         {free}{verdict}",
        ]


class LayerSetUsage(BaseModel):
    """One layer set the done jobs read, how many of them, and when the last one finished."""

    layers: list[int]
    jobs: int
    last_finished_at: datetime


class LayerUsage(BaseModel):
    """`GET /layers/usage`: the layer sets (served layer ids) of the jobs done since `since`, most used
    first, and their union: what keeping a subset of the stored layers must keep for them."""

    since: datetime
    layer_sets: list[LayerSetUsage]
    layers: list[int]


def _size(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"
