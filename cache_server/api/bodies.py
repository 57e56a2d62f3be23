"""The tensor bodies the service hands out: `GET /hidden` as one preallocated safetensors buffer
filled straight from the store, and `GET /target/heads`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from safetensors.torch import save

from cache_server.capture.target import Target
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from cache_server.torch_utils import dtype_name
from schemas.hidden import (
    EMBED_TENSOR,
    FINAL_NORM_TENSOR,
    HIDDEN_TENSOR,
    LM_HEAD_TENSOR,
    TOKEN_IDS_TENSOR,
    HiddenMetadata,
)
from schemas.safetensors_frame import FramedBody, TensorSpec, frame, numpy_dtype
from schemas.storage import describe_storage


def hidden_metadata(manifest: PromptManifest, layers: Sequence[int], start: int, stop: int) -> HiddenMetadata:
    """The `__metadata__` of a `/hidden` body: which prompt, layers, convention, target and rows."""
    return HiddenMetadata(
        prompt_id=manifest.prompt_id,
        layers=list(layers),
        layer_convention=manifest.layer_convention,
        model_fingerprint=manifest.model_fingerprint,
        hidden_size=manifest.hidden_size,
        prompt_len=manifest.prompt_len,
        start=start,
        stop=stop,
        dtype=manifest.dtype,
        storage=describe_storage(manifest.storage),
        greedy_mismatches=manifest.greedy_mismatches,
        generator=manifest.generator.describe() if manifest.generator is not None else None,
        capture=manifest.capture.describe() if manifest.capture is not None else f"hf {manifest.dtype}",
        sampling=manifest.sampling.model_dump_json() if manifest.sampling is not None else None,
        outside_support=manifest.outside_support,
    )


def hidden_body(
    store: HiddenStore, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int
) -> FramedBody:
    """hidden [stop-start, len(layers)*H] in request order + token_ids, exact stored bytes."""
    rows, width = stop - start, len(layers) * manifest.hidden_size
    meta = hidden_metadata(manifest, layers, start, stop)
    body = frame(
        [
            TensorSpec(HIDDEN_TENSOR, numpy_dtype(manifest.dtype), (rows, width)),
            TensorSpec(TOKEN_IDS_TENSOR, np.dtype(np.int64), (rows,)),
        ],
        meta.to_strings(),
    )
    out = body.regions[HIDDEN_TENSOR].view(store.numpy_dtype).reshape(rows, width)
    store.read_into(manifest.prompt_id, layers, out, start, stop)
    body.regions[TOKEN_IDS_TENSOR].view(np.int64)[:] = store.token_ids(manifest.prompt_id)[start:stop]
    return body


def heads_body(target: Target) -> bytes:
    """The safetensors body of a target's embed_tokens and lm_head, and its final norm's weight, eps and kind
    (`final_norm_kind`: "rmsnorm" or "rmsnorm_zero_centered") when it is an RMSNorm the cache serves (the
    service builds it once)."""
    heads = target.heads
    tensors = {EMBED_TENSOR: heads.embed.contiguous(), LM_HEAD_TENSOR: heads.lm_head.contiguous().clone()}  # tied?
    metadata = {"model_fingerprint": target.info.fingerprint, "dtype": dtype_name(heads.embed.dtype)}
    if heads.final_norm is not None:
        tensors[FINAL_NORM_TENSOR] = heads.final_norm.weight.contiguous()
        metadata["final_norm_eps"] = repr(heads.final_norm.eps)
        metadata["final_norm_kind"] = heads.final_norm.kind
    return save(tensors, metadata=metadata)
