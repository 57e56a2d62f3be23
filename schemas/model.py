"""What a server says about the target whose hidden states it serves: the target itself
(`TargetDescription`) and, in `GET /model`, what the server does with it (`ModelInfo`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.dtypes import DTypeName
from schemas.layers import LAYER_CONVENTION, LayerConvention
from schemas.prompts import CaptureInfo, GeneratorInfo
from schemas.storage import StorageName


class TargetDescription(BaseModel):
    """A target as its states are computed and stored: identity, shape, dtype, how they are computed
    and how stored. The server's own description of its target, and the first part of `GET /model`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    fingerprint: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: DTypeName
    storage: StorageName = Field(default="exact", description="how the states are stored (`schemas/storage.py`)")
    capture: CaptureInfo | None = Field(
        default=None,
        description="who computes the states: the server's forward (hf) or the engine's (part of the fingerprint); "
        "None: a server from before engine capture",
    )


class ModelInfo(TargetDescription):
    """`GET /model`: the target, and what this server does with it (the layers it captures, who
    generates its responses, which instance answered)."""

    model_config = ConfigDict(frozen=False, extra="forbid")
    layer_convention: LayerConvention = LAYER_CONVENTION
    capture_layers: list[int]
    chat_template_sha256: str | None = Field(
        default=None, description="sha256 of the tokenizer's chat template; None: it has none (prompts go as text)"
    )
    instance: str | None = Field(
        default=None, description="the server instance that answered (several may serve one store)"
    )
    generator: GeneratorInfo | None = Field(default=None, description="who generates this server's new responses")
