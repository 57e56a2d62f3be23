"""The tensor endpoints: names and metadata in the safetensors bodies of `GET /hidden` and
`GET /target/heads` (the decoded results are the client's `HiddenResult` and `TargetHeads`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from schemas.layers import LAYER_CONVENTION, RequestLayerConvention, format_layer_list, parse_layer_list
from schemas.loss_mask import mask_of, parse_spans, served_spans
from schemas.sampling import SamplingParams

if TYPE_CHECKING:
    import numpy as np

HIDDEN_TENSOR = "hidden"
TOKEN_IDS_TENSOR = "token_ids"
EMBED_TENSOR = "embed_tokens.weight"
LM_HEAD_TENSOR = "lm_head.weight"
FINAL_NORM_TENSOR = "norm.weight"  # the target's final RMSNorm (plain or zero-centred: metadata final_norm_kind)
# `final_norm_kind`: weight * x / rms(x) (Llama, DeepSeek-V3), or (1 + weight) * x / rms(x) (Qwen3-Next, Qwen3.5)
PLAIN_NORM_KIND, ZERO_CENTERED_NORM_KIND = "rmsnorm", "rmsnorm_zero_centered"


# `final_norm` on `/hidden`: the target's last layer as stored (raw, the residual stream), or after the
# target's final norm ("post", what HF's `hidden_states[-1]` and SpecForge's EAGLE-3 `hidden_state` hold).
FinalNormMode = Literal["raw", "post"]


@dataclass(frozen=True)
class LayerRequest:
    """How a `/hidden` request named its layers and what it asked of the target's last one; the body's
    metadata says the same (`layers` as asked, in `convention`; `final_norm` when "post")."""

    asked: tuple[int, ...]
    convention: RequestLayerConvention = LAYER_CONVENTION
    final_norm: FinalNormMode = "raw"


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
    dtype: str  # the tensor's: the target's
    storage: str = "exact"  # `schemas.storage.describe_storage`: e.g. "float8_e4m3fn per-token scale"
    greedy_mismatches: int | None = None  # response tokens that are not the target's greedy choice
    generator: str | None = None  # how the response was made (`GeneratorInfo.describe()`)
    capture: str | None = None  # how the states were computed (`CaptureInfo.describe()`; None: not said)
    sampling: str | None = None  # how it was sampled from the target: `SamplingParams` as JSON (None: greedy)
    outside_support: int | None = None  # a sampled response's tokens outside the support of its setting
    final_norm: FinalNormMode | None = None  # "post": the last layer's columns are after the final norm
    loss_spans: str | None = None  # the tokens trained on (`schemas.loss_mask.format_spans`); None: the response

    def loss_mask(self) -> np.ndarray:
        """The body's rows of the prompt's loss mask, int64 0/1 (the response tokens unless it says other)."""
        spans = parse_spans(self.loss_spans) if self.loss_spans is not None else None
        return mask_of(served_spans(spans, self.prompt_len, max(self.stop, self.prompt_len)), self.start, self.stop)

    @property
    def sampling_params(self) -> SamplingParams | None:
        """`sampling` read back (None: greedy)."""
        return SamplingParams.model_validate_json(self.sampling) if self.sampling else None

    def to_strings(self) -> dict[str, str]:
        """As safetensors `__metadata__` (every value a string)."""
        out = {k: str(v) for k, v in self.model_dump().items() if v is not None}
        out["layers"] = format_layer_list(self.layers)
        return out

    @classmethod
    def from_strings(cls, meta: dict[str, str]) -> HiddenMetadata:
        """Read back what `to_strings` wrote."""
        layers = parse_layer_list(meta.get("layers", ""))
        return cls.model_validate({**meta, "layers": layers})
