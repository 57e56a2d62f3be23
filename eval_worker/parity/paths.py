"""An engine's output path on the cache server: registered as a given response with the setting it was
sampled at and the engine that made it (a prompt of its own: the setting and seed are part of its id),
so that the target captures it and the offline walks read that very path."""

from __future__ import annotations

from collections.abc import Sequence

from cache_server.client import CacheClient
from schemas.prompts import GeneratorInfo, PromptSpec
from schemas.sampling import SamplingParams


def register_path(
    client: CacheClient,
    prompt: Sequence[int],
    response: Sequence[int],
    sampling: SamplingParams,
    generator: GeneratorInfo,
    name: str,
) -> str:
    """Register `response` after `prompt` as sampled at `sampling` by `generator`; its prompt id (the same
    path registered again is the same id: a no-op)."""
    spec = PromptSpec(
        token_ids=list(prompt), response_token_ids=list(response), sampling=sampling, generator=generator, name=name
    )
    [registered] = client.register([spec])
    return registered.prompt_id


def split_tokens(client: CacheClient, prompt_id: str) -> tuple[list[int], list[int]]:
    """A stored prompt's (prompt tokens, response tokens)."""
    state = client.prompt(prompt_id)
    tokens = state.token_ids or []
    return tokens[: state.prompt_len], tokens[state.prompt_len :]
