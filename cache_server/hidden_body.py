"""The `GET /hidden` body: one preallocated safetensors buffer filled straight from the store."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from cache_server.dtypes import TORCH_DTYPES
from cache_server.errors import InvalidLayers
from cache_server.store import HiddenStore, PromptManifest
from cache_server.wire import FramedBody, TensorSpec, frame
from schemas.hidden import HIDDEN_TENSOR, TOKEN_IDS_TENSOR, HiddenMetadata


def token_range(manifest: PromptManifest, start: int | None, stop: int | None) -> tuple[int, int]:
    n = manifest.num_tokens
    lo = 0 if start is None else start
    hi = n if stop is None else stop
    if not 0 <= lo < hi <= n:
        raise InvalidLayers(f"token range start={start} stop={stop} is invalid; need 0 <= start < stop <= {n}")
    return lo, hi


def hidden_body(
    store: HiddenStore, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int
) -> FramedBody:
    """hidden [stop-start, len(layers)*H] in request order + token_ids, exact stored bytes."""
    rows, width = stop - start, len(layers) * manifest.hidden_size
    meta = HiddenMetadata(
        prompt_id=manifest.prompt_id,
        layers=list(layers),
        layer_convention=manifest.layer_convention,
        model_fingerprint=manifest.model_fingerprint,
        hidden_size=manifest.hidden_size,
        prompt_len=manifest.prompt_len,
        start=start,
        stop=stop,
        dtype=manifest.dtype,
        greedy_mismatches=manifest.greedy_mismatches,
    )
    body = frame(
        [
            TensorSpec(HIDDEN_TENSOR, TORCH_DTYPES[manifest.dtype], (rows, width)),
            TensorSpec(TOKEN_IDS_TENSOR, torch.int64, (rows,)),
        ],
        meta.to_strings(),
    )
    out = body.regions[HIDDEN_TENSOR].view(store.numpy_dtype).reshape(rows, width)
    store.read_into(manifest.prompt_id, layers, out, start, stop)
    body.regions[TOKEN_IDS_TENSOR].view(np.int64)[:] = store.token_ids(manifest.prompt_id)[start:stop]
    return body
