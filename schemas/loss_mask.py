"""Which tokens a drafter is trained on, kept as half-open token ranges (`spans`) over prompt and response:
the response by default, a chat's assistant turns, or a mask given 0/1 per token. Ranges, not a
per-token array, because they are a handful per prompt and sit in a JSON manifest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

Spans = tuple[tuple[int, int], ...]  # sorted, disjoint, non-empty [start, stop) ranges


def spans_of(mask: Sequence[int]) -> Spans:
    """The ranges of 1s in a 0/1 mask: `[0, 1, 1, 0, 1]` -> `((1, 3), (4, 5))`."""
    spans: list[tuple[int, int]] = []
    for i, bit in enumerate(mask):
        if bit and spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        elif bit:
            spans.append((i, i + 1))
    return tuple(spans)


def mask_of(spans: Spans, start: int, stop: int) -> np.ndarray:
    """Rows start:stop of the 0/1 mask (int64) that `spans` describe."""
    import numpy as np  # not at import: the command lines read schemas before a command needs numpy

    mask = np.zeros(stop - start, dtype=np.int64)
    for lo, hi in spans:
        mask[max(lo, start) - start : max(min(hi, stop) - start, 0)] = 1
    return mask


def joined(spans: Spans, more: Spans) -> Spans:
    """`spans` and `more` as one sorted, disjoint tuple (touching ranges merged)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans + more):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def served_spans(stored: Spans | None, prompt_len: int, num_tokens: int) -> Spans:
    """A stored prompt's trained-on ranges: `stored`, or by default (None) the response tokens."""
    if stored is None:
        return ((prompt_len, num_tokens),) if num_tokens > prompt_len else ()
    return stored


def format_spans(spans: Spans) -> str:
    """`((1, 3), (4, 5))` -> `"1-3,4-5"` (safetensors metadata holds strings; "" is no token)."""
    return ",".join(f"{lo}-{hi}" for lo, hi in spans)


def parse_spans(text: str) -> Spans:
    """What `format_spans` wrote, read back (ValueError on anything else)."""
    if not text:
        return ()
    spans = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        spans.append((int(lo), int(hi)))
    if any(lo >= hi for lo, hi in spans) or spans != sorted(spans):
        raise ValueError(f"loss spans must be sorted non-empty ranges, got {text!r}")
    return tuple(spans)
