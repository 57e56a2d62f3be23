"""What the tensor endpoints decode to: numpy arrays (exact served bytes) and a torch view of them.

torch is imported only inside `to_torch`, so the client stays light for callers that never need it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from schemas.hidden import (
    EMBED_TENSOR,
    FINAL_NORM_TENSOR,
    LM_HEAD_TENSOR,
    PLAIN_NORM_KIND,
    ZERO_CENTERED_NORM_KIND,
    HiddenMetadata,
)

if TYPE_CHECKING:
    import torch


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """`array` as a torch tensor sharing its memory (copied once if it is read-only)."""
    from cache_server.torch_utils import as_torch  # torch: only when a tensor is asked for

    if not array.flags.writeable:
        array = array.copy()  # torch.from_numpy would alias memory it may not write
    return as_torch(array)


@dataclass(frozen=True)
class HiddenResult:
    """One prompt's features: hidden [T, len(layers) * H] in request order, token_ids [T] int64."""

    hidden: np.ndarray
    token_ids: np.ndarray
    metadata: HiddenMetadata

    def to_torch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, token_ids) as torch tensors over the same memory."""
        return as_tensor(self.hidden), as_tensor(self.token_ids)


# `final_norm_kind` in a `GET /target/heads` body; a body without it is from a server that served plain ones only.


@dataclass(frozen=True)
class TargetHeads:
    """The target's input embedding and output head, both [V, H], the target they belong to, and its final
    RMSNorm when the server serves it: weight [H] and eps, applied as `weight * x / rms(x)` or, when
    `final_norm_zero_centered`, as `(1 + weight) * x / rms(x)`."""

    embed_tokens: np.ndarray
    lm_head: np.ndarray
    fingerprint: str
    final_norm: np.ndarray | None = None  # [H], when the target's final norm is an RMSNorm the cache serves
    final_norm_eps: float | None = None
    final_norm_zero_centered: bool = False

    @classmethod
    def from_body(cls, tensors: Mapping[str, np.ndarray], meta: Mapping[str, str]) -> TargetHeads:
        """The heads in a `GET /target/heads` body (KeyError names what it lacks). A final norm of a kind this
        client does not know is left out, as a server that does not serve it would: applying it as another
        kind would give wrong distributions."""
        eps, kind = meta.get("final_norm_eps"), meta.get("final_norm_kind", PLAIN_NORM_KIND)
        norm = tensors.get(FINAL_NORM_TENSOR)
        if norm is None or eps is None or kind not in (PLAIN_NORM_KIND, ZERO_CENTERED_NORM_KIND):
            return cls(tensors[EMBED_TENSOR], tensors[LM_HEAD_TENSOR], meta["model_fingerprint"])
        return cls(
            tensors[EMBED_TENSOR],
            tensors[LM_HEAD_TENSOR],
            meta["model_fingerprint"],
            norm,
            float(eps),
            kind == ZERO_CENTERED_NORM_KIND,
        )

    def to_torch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(embed_tokens, lm_head) as torch tensors over the same memory."""
        return as_tensor(self.embed_tokens), as_tensor(self.lm_head)
