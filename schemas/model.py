"""What `GET /model` says about the target whose hidden states are served."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# Tap id k = output of decoder layer k, 0-based (HF hidden_states[k + 1]); the last layer unnormed.
LAYER_CONVENTION: Literal["decoder_output_0based"] = "decoder_output_0based"


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    fingerprint: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    layer_convention: Literal["decoder_output_0based"] = LAYER_CONVENTION
    capture_layers: list[int]
