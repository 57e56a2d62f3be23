"""What `GET /model` says about the target whose hidden states are served."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.layers import LAYER_CONVENTION, LayerConvention
from schemas.prompts import CaptureInfo, GeneratorInfo
from schemas.storage import StorageName


class ModelInfo(BaseModel):
    """The target whose hidden states are served: identity, shape, dtype and the layers captured."""

    model_config = ConfigDict(extra="forbid")
    name: str
    fingerprint: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    storage: StorageName = Field(default="exact", description="how the states are stored (`schemas/storage.py`)")
    layer_convention: LayerConvention = LAYER_CONVENTION
    capture_layers: list[int]
    chat_template_sha256: str | None = Field(
        default=None, description="sha256 of the tokenizer's chat template; None: it has none (prompts go as text)"
    )
    instance: str | None = Field(
        default=None, description="the server instance that answered (several may serve one store)"
    )
    generator: GeneratorInfo | None = Field(default=None, description="who generates this server's new responses")
    capture: CaptureInfo | None = Field(
        default=None,
        description="who computes the states: the server's forward (hf) or the engine's (part of the fingerprint)",
    )
