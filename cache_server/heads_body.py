"""The `GET /target/heads` body: the target's embedding and lm_head, which DFlash drafters borrow."""

from __future__ import annotations

from functools import cache

from safetensors.torch import save

from cache_server.dtypes import dtype_name
from cache_server.target import Target
from schemas.hidden import EMBED_TENSOR, LM_HEAD_TENSOR


@cache
def heads_body(target: Target) -> bytes:
    """Serialised once per target: the heads never change while it is loaded."""
    embed, lm_head = target.heads()
    return save(
        {
            EMBED_TENSOR: embed.contiguous(),
            LM_HEAD_TENSOR: lm_head.contiguous().clone(),
        },  # clone: may be tied
        metadata={
            "model_fingerprint": target.info.fingerprint,
            "dtype": dtype_name(embed.dtype),
        },
    )
