"""The OpenAI-compatible completions request this project sends a serving engine (vLLM, SGLang):
token ids in, greedy, token ids out (`return_token_ids`), never a round trip through text. Shared by
the cache server's generator and `eval-worker parity`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def greedy_completion(
    model: str, prompt_ids: Sequence[int], max_tokens: int, stop_token_ids: Sequence[int] = ()
) -> dict[str, Any]:
    """`POST /v1/completions` body: greedy, token ids both ways, stopping only at `stop_token_ids`
    (the engine's own idea of EOS is ignored) or after `max_tokens`."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        "ignore_eos": True,
        "stop_token_ids": list(stop_token_ids),
    }


def completion_token_ids(answer: Mapping[str, Any]) -> list[int] | None:
    """The generated token ids of a completions answer; None when it carries none."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    ids = choices[0].get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return None
    return ids
