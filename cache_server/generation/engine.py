"""A serving engine's OpenAI-compatible completions API (vLLM, SGLang) as the source of greedy and
sampled responses: prompt token ids in, response token ids out, never a round trip through text.

Errors:

    EngineError
    ├── EngineUnavailable   unreachable, timed out, or a 5xx: try the same request again later
    │   └── CaptureLost     it answered a prefill but never wrote its capture file: prefill it again
    ├── EngineRefused       the engine refused this one request (4xx): its prompt fails with the message
    └── EngineUnfit         at startup: no model, no token ids, or another model than the target
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cache_server.generation.capture_files import discard_capture_file, written_file
from schemas.completions import completion_body, completion_token_ids
from schemas.prompts import GeneratorInfo
from schemas.sampling import SamplingParams


class EngineError(Exception):
    """Base of the engine client's errors."""


class EngineUnavailable(EngineError):
    """The engine did not answer (connection, timeout) or answered 5xx: retry later."""


class CaptureLost(EngineUnavailable):
    """The engine answered the prefill of the batch's sequence `index` but wrote no file for it (it died
    between the two, or its writer failed): the batch waits for the engine, that sequence's prompt
    spending one of its capture attempts."""

    def __init__(self, message: str, *, index: int) -> None:
        super().__init__(message)
        self.index = index


class EngineRefused(EngineError):
    """The engine refused this request (4xx), e.g. a prompt longer than its context."""


class EngineUnfit(EngineError):
    """The engine cannot serve as this target's generator (checked once, at startup)."""


@dataclass(frozen=True)
class Engine:
    """An engine checked at startup: where it is, the model name to ask for, how it stops."""

    url: str
    model: str
    version: str | None
    stop_token_ids: tuple[int, ...]  # the target's EOS ids: a response ends after one, as in-process

    @property
    def info(self) -> GeneratorInfo:
        """What each prompt records about how its response was made."""
        return GeneratorInfo(kind="engine", url=self.url, model=self.model, version=self.version)

    def completion(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None
    ) -> dict[str, Any]:
        """The completions body, stopping only where the target's own `generate` stops (its EOS ids)."""
        return completion_body(self.model, prompt_ids, max_tokens, self.stop_token_ids, sampling)


def response_tokens(response: httpx.Response) -> list[int]:
    """The generated token ids of a completions answer; EngineUnavailable on 5xx, EngineRefused on 4xx
    or an answer without token ids."""
    if response.status_code >= 500:
        raise EngineUnavailable(f"HTTP {response.status_code}: {error_message(response)}")
    if response.status_code >= 400:
        raise EngineRefused(f"the engine refused the prompt (HTTP {response.status_code}): {error_message(response)}")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not answer.get("choices"):
        raise EngineRefused(f"the engine's answer has no choices: {response.text[:200]}")
    ids = completion_token_ids(answer)
    if ids is None:
        raise EngineRefused(
            'the engine returned no token ids: it must honour "return_token_ids": true (vLLM >= 0.10.2); '
            "responses are never re-tokenised from text"
        )
    return ids


def error_message(response: httpx.Response) -> str:
    """The message of an engine's error answer (its JSON error, else the start of the body)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:500]


def engine_root(url: str) -> str:
    """The engine's root URL, whose `/v1/...` and `/version` routes the server calls: `http://h:8000/v1/`
    and `http://h:8000` are one engine."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


def connect(
    url: str, *, model: str | None, target_name: str, stop_token_ids: Sequence[int], timeout_s: float
) -> Engine:
    """The engine at `url`, with the model it serves (`model`, or its only one, or the one named like
    the target) and its version; EngineUnfit when it cannot be reached or serves no such model. The URL
    is taken with or without `/v1` (the base URL OpenAI clients take)."""
    url = engine_root(url)
    try:
        with httpx.Client(timeout=timeout_s) as client:
            listed = client.get(f"{url}/v1/models")
            listed.raise_for_status()
            version_answer = client.get(f"{url}/version")
    except httpx.HTTPError as e:
        raise EngineUnfit(f"--generator {url}: GET /v1/models failed: {e}") from None
    served = [str(m.get("id")) for m in listed.json().get("data", [])]
    version = version_answer.json().get("version") if version_answer.status_code == 200 else None
    if model is not None:
        if model not in served:
            raise EngineUnfit(f"--generator {url} serves {served}, not --generator-model {model!r}")
        chosen = model
    else:
        named = [m for m in served if m.rstrip("/").rsplit("/", 1)[-1] == target_name]
        if len(served) == 1 or len(named) == 1:
            chosen = served[0] if len(served) == 1 else named[0]
        else:
            raise EngineUnfit(f"--generator {url} serves {served or 'no model'}: name one with --generator-model")
    return Engine(
        url=url, model=chosen, version=str(version) if version else None, stop_token_ids=tuple(stop_token_ids)
    )


def generate_once(
    engine: Engine, prompt_ids: Sequence[int], max_tokens: int, *, timeout_s: float, files: Path | None = None
) -> list[int]:
    """One blocking generation (the startup probe); EngineUnfit on any failure. `files`: where an engine
    that captures every request writes its states (deleted: a generation's are not wanted)."""
    try:
        with httpx.Client(timeout=timeout_s) as client:
            response = client.post(f"{engine.url}/v1/completions", json=engine.completion(prompt_ids, max_tokens))
        tokens = response_tokens(response)
    except (httpx.HTTPError, EngineError) as e:
        raise EngineUnfit(f"--generator {engine.url}: the probe generation failed: {e}") from None
    if files is not None and (written := written_file(response.json(), files)) is not None:
        discard_capture_file(written)
    return tokens


class EngineClient:
    """Generations on one engine from an asyncio loop; the client is made on first use, in that loop."""

    def __init__(self, engine: Engine, *, timeout_s: float, concurrency: int, files: Path | None = None) -> None:
        """`files`: where an engine that captures every request writes its states (the engine-capture
        directory): a generation's are deleted once written, as no capture wants them."""
        self.engine, self.files = engine, files
        self._timeout_s = timeout_s
        self._limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client: httpx.AsyncClient | None = None

    async def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None
    ) -> list[int]:
        """The engine's response, greedy or sampled at `sampling` with its seed; EngineUnavailable (retry)
        or EngineRefused (give up)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout_s, limits=self._limits)
        body = self.engine.completion(prompt_ids, max_tokens, sampling)
        try:
            response = await self._client.post(f"{self.engine.url}/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"{type(e).__name__}: {e}") from None
        tokens = response_tokens(response)
        if self.files is not None and (written := written_file(response.json(), self.files)) is not None:
            await asyncio.to_thread(discard_capture_file, written)  # waits for the engine's writer
        return tokens

    async def aclose(self) -> None:
        """Close the connections (from the loop that used them)."""
        if self._client is not None:
            await self._client.aclose()
