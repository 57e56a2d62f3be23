"""The tensor endpoints: names and metadata in the safetensors bodies of `GET /hidden` and
`GET /target/heads`, and the decoded results both sides hand around."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict
from torch import Tensor

HIDDEN_TENSOR = "hidden"
TOKEN_IDS_TENSOR = "token_ids"
EMBED_TENSOR = "embed_tokens.weight"
LM_HEAD_TENSOR = "lm_head.weight"


class HiddenMetadata(BaseModel):
    """`__metadata__` of a `/hidden` body (safetensors stores strings; `layers` is comma-joined)."""

    model_config = ConfigDict(extra="forbid")
    prompt_id: str
    layers: list[int]
    layer_convention: str
    model_fingerprint: str
    hidden_size: int
    prompt_len: int
    start: int
    stop: int
    dtype: str
    greedy_mismatches: int | None = None  # response tokens that are not the target's greedy choice

    def to_strings(self) -> dict[str, str]:
        out = {k: str(v) for k, v in self.model_dump().items() if v is not None}
        out["layers"] = ",".join(str(k) for k in self.layers)
        return out

    @classmethod
    def from_strings(cls, meta: dict[str, str]) -> HiddenMetadata:
        layers = [int(k) for k in meta["layers"].split(",")] if meta.get("layers") else []
        return cls.model_validate({**meta, "layers": layers})


@dataclass(frozen=True)
class HiddenResult:
    """Taps of one prompt: hidden [T, len(layers) * H] (request order), token_ids [T] int64."""

    hidden: Tensor
    token_ids: Tensor
    metadata: HiddenMetadata


@dataclass(frozen=True)
class TargetHeads:
    """The target's input embedding and output head, both [V, H]."""

    embed_tokens: Tensor
    lm_head: Tensor
    fingerprint: str
