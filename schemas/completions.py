"""The OpenAI-compatible completions request this project sends a serving engine (vLLM, SGLang):
token ids in, greedy or sampled with a seed, token ids out (`return_token_ids`), never a round trip
through text. Shared by the cache server's generator and `eval-worker parity`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.sampling import SamplingParams


def completion_body(
    model: str,
    prompt_ids: Sequence[int],
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
    sampling: SamplingParams | None = None,
) -> dict[str, Any]:
    """`POST /v1/completions` body: greedy (`sampling` None or at temperature 0) or sampled with its
    temperature, filters and seed (vLLM's parameter names: a seed makes the request reproducible),
    token ids both ways, stopping only at `stop_token_ids` (the engine's own idea of EOS is ignored)
    or after `max_tokens`."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        "ignore_eos": True,
        "stop_token_ids": list(stop_token_ids),
    }
    if sampling is not None and not sampling.greedy:
        body |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed}
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.min_p:
            body["min_p"] = sampling.min_p
    return body


def completion_token_ids(answer: Mapping[str, Any]) -> list[int] | None:
    """The generated token ids of a completions answer; None when it carries none."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    ids = choices[0].get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return None
    return ids
