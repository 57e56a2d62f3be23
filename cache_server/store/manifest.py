"""The manifest of one published prompt: what it holds, written last, so its presence means the data is
complete; and the names and layer ids the store accepts (its errors: `errors.py`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from cache_server.store.errors import StoreCorrupt, StoreInputError
from schemas.dtypes import DTypeName
from schemas.layers import LAYER_CONVENTION, LayerConvention
from schemas.loss_mask import Spans
from schemas.prompts import CaptureInfo, GeneratorInfo
from schemas.sampling import SamplingParams
from schemas.storage import StorageName


class PromptManifest(BaseModel):
    """What one published prompt holds; written last, so its presence means the data is complete."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    prompt_id: str
    model_fingerprint: str
    model_name: str
    dtype: DTypeName  # the target's: what `/hidden` serves
    storage: StorageName = "exact"  # how the layers are kept (`schemas/storage.py`)
    layer_convention: LayerConvention = LAYER_CONVENTION
    layers: tuple[int, ...]
    prompt_len: int
    num_tokens: int
    hidden_size: int
    token_sha256: str
    codec: str
    created_at: str
    # Response tokens that are not the target's argmax under the stored forward (None: not checked).
    # 0 means the response is the target's own greedy continuation, so offline tau equals the live
    # greedy loop's; a given (not generated) response usually differs.
    greedy_mismatches: int | None = None
    generator: GeneratorInfo | None = None  # how the response was made (None: a prompt published before it was kept)
    # How the response was sampled from the target (None: greedy), and for a sampled one the response
    # tokens outside the support of that setting under the stored forward (None: greedy, not checked).
    sampling: SamplingParams | None = None
    outside_support: int | None = None
    capture: CaptureInfo | None = None  # how an engine computed the states (None: the server's forward, hf)
    # The token ranges a drafter trains on (`schemas.loss_mask`); None: the response tokens, the default.
    loss_spans: Spans | None = None
    # zlib.crc32 of each layer's zarr.json, which holds the crc32 of each of its chunks: readers
    # check both, so a layer overwritten after publishing is an error, never served (None: a prompt
    # published before checksums).
    layer_crc32: dict[int, int] | None = None
    scale_crc32: dict[int, int] | None = None  # an FP8 store's: the same for each layer's scales array

    def as_written(self) -> dict[str, object]:
        """The manifest's JSON as published: an exact store's leaves the FP8 fields out, and a greedy
        prompt's the sampling fields, so that servers from before either existed, sharing the store
        during an upgrade, still read it."""
        exact = self.storage == "exact" and self.scale_crc32 is None
        left_out = {"storage", "scale_crc32"} if exact else set()
        if self.sampling is None:  # a greedy prompt's manifest is as servers from before sampling wrote it
            left_out |= {"sampling", "outside_support"}
        if self.capture is None:  # and an hf capture's as servers from before engine captures
            left_out.add("capture")
        if self.loss_spans is None:  # and a default-masked one's as servers from before loss masks
            left_out.add("loss_spans")
        return self.model_dump(mode="json", exclude=left_out or None)


# the prompt's data, then its target's description by keyword
def first_manifest(  # noqa: PLR0913
    prompt_id: str,
    token_ids: np.ndarray,
    prompt_len: int,
    crc32: dict[int, int],
    scale_crc32: dict[int, int] | None,
    greedy_mismatches: int | None,
    generator: GeneratorInfo | None,
    *,
    fingerprint: str,
    model_name: str,
    dtype: str,
    storage: StorageName,
    hidden_size: int,
    codec: str,
) -> PromptManifest:
    """The manifest of a prompt's first write: its layers (layer -> the crc32 of its zarr.json, and of
    its scales' in an FP8 store)."""
    return PromptManifest(
        prompt_id=prompt_id,
        model_fingerprint=fingerprint,
        model_name=model_name,
        dtype=dtype,  # type: ignore[arg-type]  # the store checked it
        storage=storage,
        layers=tuple(sorted(crc32)),
        prompt_len=prompt_len,
        num_tokens=len(token_ids),
        hidden_size=hidden_size,
        token_sha256=token_sha256(token_ids),
        codec=codec,
        created_at=datetime.now(UTC).isoformat(),
        greedy_mismatches=greedy_mismatches,
        generator=generator,
        layer_crc32=dict(sorted(crc32.items())),
        scale_crc32=dict(sorted(scale_crc32.items())) if scale_crc32 is not None else None,
    )


def with_layers(m: PromptManifest, crc32: dict[int, int], scale_crc32: dict[int, int] | None) -> PromptManifest:
    """`m` holding the layers of `crc32` too (layer -> the crc32 of its zarr.json, and of its scales')."""
    update: dict[str, object] = {
        "layers": tuple(sorted({*crc32, *m.layers})),
        "layer_crc32": dict(sorted({**(m.layer_crc32 or {}), **crc32}.items())),
    }
    if scale_crc32 is not None:
        update["scale_crc32"] = dict(sorted({**(m.scale_crc32 or {}), **scale_crc32}.items()))
    return m.model_copy(update=update)


def without_layers(m: PromptManifest, layers: Sequence[int]) -> PromptManifest:
    """`m` no longer holding `layers` (their files are left for a later write to replace)."""

    def kept(crc32: dict[int, int] | None) -> dict[int, int] | None:
        return {k: v for k, v in crc32.items() if k not in layers} if crc32 is not None else None

    return m.model_copy(
        update={
            "layers": tuple(k for k in m.layers if k not in layers),
            "layer_crc32": kept(m.layer_crc32),
            "scale_crc32": kept(m.scale_crc32),
        }
    )


def token_sha256(token_ids: np.ndarray) -> str:
    """sha256 of the int64 little-endian token id bytes."""
    return hashlib.sha256(np.ascontiguousarray(token_ids, dtype="<i8").tobytes()).hexdigest()


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_name(name: str, what: str) -> None:
    """StoreInputError unless `name` is safe as one directory name (ids and fingerprints)."""
    if not _SAFE_NAME.fullmatch(name):
        raise StoreInputError(f"{what} {name!r} must match {_SAFE_NAME.pattern}")


def layer_id(layer: object) -> int:
    """A layer id as an int >= 0; StoreInputError for anything else (bools included)."""
    if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or layer < 0:
        raise StoreInputError(f"layer ids must be ints >= 0, got {layer!r}")
    return int(layer)


def parse_manifest(text: str, prompt_id: str, expected: tuple[str, str, str, int]) -> PromptManifest:
    """A prompt's manifest, checked against the store reading it: (fingerprint, dtype, storage, hidden size)."""
    try:
        m = PromptManifest.model_validate_json(text)
    except ValidationError as e:
        raise StoreCorrupt(f"prompt {prompt_id!r}: manifest unreadable: {e}") from e
    fingerprint, dtype, storage, hidden = expected
    if (m.prompt_id, m.model_fingerprint, m.dtype, m.storage, m.hidden_size) != (prompt_id, *expected):
        raise StoreCorrupt(
            f"prompt {prompt_id!r}: manifest says {m.prompt_id}/{m.model_fingerprint}/{m.dtype}/{m.storage}/"
            f"H={m.hidden_size}, this store is {fingerprint}/{dtype}/{storage}/H={hidden}"
        )
    return m
