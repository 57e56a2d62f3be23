"""The `GET /target/heads` body: the target's embedding and lm_head, which DFlash drafters borrow."""

from __future__ import annotations

from safetensors.torch import save

from cache_server.dtypes import dtype_name
from cache_server.target import Target
from schemas.hidden import EMBED_TENSOR, LM_HEAD_TENSOR


def heads_body(target: Target) -> bytes:
    """The safetensors body of a target's heads (the service serialises it once)."""
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
