"""What a layer id means, and the one parser and validator of layer lists and integer parameters.

Layer id k is the output of decoder layer k, counting from 0: the residual stream after layer k,
HF's `hidden_states[k + 1]`, with the last layer taken raw (before the final norm). Ids on the wire
are plain ASCII decimal integers: `1_0`, `١` or `true` are refused, never read as a number.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator

from schemas.choices import one_of

LayerConvention = Literal["decoder_output_0based"]
LAYER_CONVENTION: LayerConvention = "decoder_output_0based"
# How a request may number layers: as the cache does, or as HF's `hidden_states` index (id + 1; index 0,
# the embeddings, is not stored), the numbering speculators' and SpecForge's configs write.
RequestLayerConvention = Literal["decoder_output_0based", "hf_index"]
REQUEST_LAYER_CONVENTIONS: tuple[RequestLayerConvention, ...] = get_args(RequestLayerConvention)
# How a checkpoint's layer ids may be read: layer input i is decoder output i - 1 (REFERENCE s.8).
CheckpointLayerConvention = Literal["layer_input", "decoder_output_0based"]
CHECKPOINT_LAYER_CONVENTIONS: tuple[CheckpointLayerConvention, ...] = get_args(CheckpointLayerConvention)

_ASCII_INT = re.compile(r"-?[0-9]+")


def parse_int(text: str, what: str) -> int:
    """`text` as a plain ASCII decimal integer (an optional leading minus), else ValueError."""
    if not _ASCII_INT.fullmatch(text):
        raise ValueError(f"{what} must be a plain decimal integer, got {text!r}")
    return int(text)


def parse_layer_list(text: str, what: str = "layers") -> list[int]:
    """`"1,16,31"` -> `[1, 16, 31]`; ValueError naming `what` on anything else (empty -> [])."""
    if not text.strip():
        return []
    return [parse_int(part.strip(), what) for part in text.split(",")]


def format_layer_list(layers: Sequence[int]) -> str:
    """`[1, 16, 31]` -> `"1,16,31"`, what `parse_layer_list` reads."""
    return ",".join(str(k) for k in layers)


def layer_list_problem(layers: Sequence[int], num_layers: int) -> str | None:
    """Why `layers` is not a valid request against an `num_layers`-layer target, or None."""
    valid = f"valid layer ids are 0..{num_layers - 1} (0-based decoder outputs)"
    if not layers:
        return f"no layers asked for; {valid}"
    bad = [k for k in layers if not 0 <= k < num_layers]
    if bad:
        return f"layer ids {bad} are outside the target's 0..{num_layers - 1}; {valid}"
    if len(set(layers)) != len(layers):
        return f"duplicated layer ids in {list(layers)}; {valid}"
    return None


def decoder_outputs(layers: Sequence[int], convention: RequestLayerConvention) -> list[int]:
    """Layer ids as the cache keeps them (0-based decoder outputs) from ids in `convention`: HF's
    `hidden_states` index i is decoder output i - 1 (ValueError for index 0, the embeddings, and for a
    convention that is neither)."""
    if one_of(convention, REQUEST_LAYER_CONVENTIONS, "layer_convention") == "decoder_output_0based":
        return list(layers)
    if any(i < 1 for i in layers):
        raise ValueError(f"hf_index layer ids count from 1 (0 is the embeddings, not stored), got {list(layers)}")
    return [i - 1 for i in layers]


def _strict_int(value: object) -> object:
    """Accept ints (not bools) and ASCII digit strings; leave the rest to pydantic to refuse."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(value, str):
        return parse_int(value, "value")
    return value


# An integer parameter or field that only takes plain integers (or their ASCII spelling in a query).
AsciiInt = Annotated[int, BeforeValidator(_strict_int)]
# Listing offsets are bounded by what a database integer holds (SQLite and Postgres: 64-bit signed).
MAX_OFFSET = 2**62
