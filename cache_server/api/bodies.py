"""The tensor bodies the service hands out: `GET /hidden` as one preallocated safetensors buffer
filled straight from the store, and `GET /target/heads`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from safetensors.torch import save

from cache_server.capture.heads import FinalNorm
from cache_server.capture.target import Target
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from cache_server.torch_utils import as_numpy, as_torch, dtype_name
from schemas.hidden import (
    EMBED_TENSOR,
    FINAL_NORM_TENSOR,
    HIDDEN_TENSOR,
    LM_HEAD_TENSOR,
    TOKEN_IDS_TENSOR,
    HiddenMetadata,
    LayerRequest,
)
from schemas.loss_mask import format_spans
from schemas.safetensors_frame import FramedBody, TensorSpec, frame, numpy_dtype
from schemas.storage import describe_storage


def hidden_metadata(
    manifest: PromptManifest, layers: Sequence[int], start: int, stop: int, asked: LayerRequest | None = None
) -> HiddenMetadata:
    """The `__metadata__` of a `/hidden` body: which prompt, layers (as `asked` named them, default as
    stored), convention, target and rows."""
    return HiddenMetadata(
        prompt_id=manifest.prompt_id,
        layers=list(asked.asked if asked is not None else layers),
        layer_convention=asked.convention if asked is not None else manifest.layer_convention,
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
        final_norm="post" if asked is not None and asked.final_norm == "post" else None,
        loss_spans=format_spans(manifest.loss_spans) if manifest.loss_spans is not None else None,
    )


def hidden_body(
    store: HiddenStore,
    manifest: PromptManifest,
    layers: Sequence[int],
    start: int,
    stop: int,
    asked: LayerRequest | None = None,
    post_norm: PostNorm | None = None,
) -> FramedBody:
    """hidden [stop-start, len(layers)*H] in request order + token_ids, exact stored bytes; with
    `post_norm`, its layer's columns after the target's final norm."""
    rows, width = stop - start, len(layers) * manifest.hidden_size
    meta = hidden_metadata(manifest, layers, start, stop, asked)
    body = frame(
        [
            TensorSpec(HIDDEN_TENSOR, numpy_dtype(manifest.dtype), (rows, width)),
            TensorSpec(TOKEN_IDS_TENSOR, np.dtype(np.int64), (rows,)),
        ],
        meta.to_strings(),
    )
    out = body.regions[HIDDEN_TENSOR].view(store.numpy_dtype).reshape(rows, width)
    store.read_into(manifest.prompt_id, layers, out, start, stop)
    if post_norm is not None:
        post_norm.apply(out, layers)
    body.regions[TOKEN_IDS_TENSOR].view(np.int64)[:] = store.token_ids(manifest.prompt_id)[start:stop]
    return body


@dataclass(frozen=True)
class PostNorm:
    """The target's final norm, applied to its last layer's columns of a body (`final_norm=post`)."""

    norm: FinalNorm
    last_layer: int

    def apply(self, out: np.ndarray, layers: Sequence[int]) -> None:
        """Replace the last layer's columns of `out` [rows, len(layers) * H] by their normed values."""
        h = out.shape[1] // len(layers)
        at = list(layers).index(self.last_layer) * h
        columns = out[:, at : at + h]
        normed = self.norm(as_torch(np.ascontiguousarray(columns)))
        columns[:] = as_numpy(normed)


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
