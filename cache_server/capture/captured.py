"""What a capture hands the store, and the one interface every way of capturing implements.

A `Capturer` runs sequences (prompt + response token ids) through the target and returns, per
sequence, the outputs of the layers asked for under the project's layer convention (layer k = decoder
layer k's output) and how the response agrees with the target. The server's own transformers forward
(`hf_forward.HfForward`) is one; the serving engine's forward (`generation/engine_capture.py`) the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from schemas.layers import format_layer_list
from schemas.prompts import CaptureInfo
from schemas.sampling import SamplingParams


@dataclass(frozen=True)
class Captured:
    """One sequence's captured layers and how its response agrees with the target: a greedy response's
    tokens that are not the argmax, or a sampled one's outside the support of its setting."""

    states: dict[int, torch.Tensor]  # layer -> [T, H] on CPU, the target dtype
    greedy_mismatches: int | None  # greedy responses (None for sampled ones)
    outside_support: int | None = None  # sampled responses (None for greedy ones)

    @classmethod
    def of(cls, states: dict[int, torch.Tensor], misses: int, sampling: SamplingParams | None) -> Captured:
        """`misses` response tokens the target would not emit: greedy mismatches, or outside `sampling`'s support."""
        if sampling is None:
            return cls(states, greedy_mismatches=misses)
        return cls(states, greedy_mismatches=None, outside_support=misses)


class Capturer(Protocol):
    """Runs sequences through the target and returns their layers' outputs.

    `capture` returns one entry per sequence: its `Captured`, or the exception that fails that
    sequence's prompt alone (a file the engine wrote wrong, say). Raising fails the whole batch, except
    `EngineUnavailable`, which leaves its prompts pending until the engine is back (`CaptureLost`, a
    file the engine never wrote, spends one of its prompt's capture attempts)."""

    info: CaptureInfo
    layers: frozenset[int] | None  # the layers it can capture; None: any

    def capture(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_lens: Sequence[int],
        layers: Sequence[int],
        samplings: Sequence[SamplingParams | None] | None = None,
    ) -> list[Captured | Exception]:
        """Per sequence: its `layers`' outputs and its response's agreement with the target."""
        ...

    def close(self) -> None:
        """Release what it holds (connections, threads)."""
        ...


def uncapturable(layers: Sequence[int], capturer: Capturer) -> str | None:
    """Why `capturer` cannot capture `layers` (an engine captures the layers it was launched with), or None."""
    missing = sorted(set(layers) - capturer.layers) if capturer.layers is not None else []
    if not missing:
        return None
    return (
        f"layers {format_layer_list(missing)} are not captured by this server's engine: it captures "
        f"{format_layer_list(sorted(capturer.layers or ()))} (an engine launched with more aux layer ids captures more)"
    )
