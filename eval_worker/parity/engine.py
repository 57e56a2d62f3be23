"""A running vLLM as parity reads it: the model it serves, greedy generation from token ids, and its
speculative-decoding counters (`vllm:spec_decode_*` in its Prometheus `/metrics`), whose deltas give
one request's rounds when requests run one at a time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from schemas.completions import completion_token_ids, greedy_completion

_COUNTER = re.compile(r"^vllm:spec_decode_(num_drafts|num_accepted_tokens)_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_PER_POSITION = re.compile(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} ', re.M)


class EngineNotFit(ValueError):
    """The engine cannot answer parity: unreachable, another model, or no speculative decoding."""


@dataclass(frozen=True)
class SpecCounters:
    """The engine's running totals: draft rounds and accepted draft tokens."""

    drafts: int
    accepted: int

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(self.drafts - other.drafts, self.accepted - other.accepted)


class VllmEngine:
    """One engine URL; every call raises EngineNotFit with one line when the engine cannot answer."""

    def __init__(self, url: str, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)
        try:
            served = [str(m["id"]) for m in self._get("/v1/models").json()["data"]]
            version = self._http.get("/version")
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as e:
            raise EngineNotFit(f"--engine {self.url}: GET /v1/models failed: {e}") from None
        if len(served) != 1:
            raise EngineNotFit(f"--engine {self.url} serves {served or 'no model'}: parity needs exactly one")
        self.model = served[0]
        self.version = version.json().get("version") if version.status_code == 200 else None

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def speculative_tokens(self) -> int:
        """K, the draft tokens per round (the positions of its per-position counter); EngineNotFit when
        the engine has no speculative config."""
        text = self._get("/metrics").text
        positions = {int(p) for p in _PER_POSITION.findall(text)}
        if not _COUNTER.search(text) or not positions:
            raise EngineNotFit(
                f"--engine {self.url} reports no speculative-decoding counters in /metrics: start it with "
                "--speculative-config naming this checkpoint"
            )
        return max(positions) + 1

    def counters(self) -> SpecCounters:
        """The running totals now."""
        found = dict(_COUNTER.findall(self._get("/metrics").text))
        return SpecCounters(int(float(found.get("num_drafts", 0))), int(float(found.get("num_accepted_tokens", 0))))

    def greedy(self, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Exactly `max_tokens` greedy tokens after `prompt_ids` (EOS ignored), as token ids."""
        try:
            response = self._http.post("/v1/completions", json=greedy_completion(self.model, prompt_ids, max_tokens))
            response.raise_for_status()
            ids = completion_token_ids(response.json())
        except (httpx.HTTPError, ValueError) as e:
            raise EngineNotFit(f"--engine {self.url}: a generation failed: {e}") from None
        if ids is None:
            raise EngineNotFit(f"--engine {self.url} answered without token ids (vLLM >= 0.10.2 returns them)")
        return ids

    def _get(self, path: str) -> httpx.Response:
        try:
            response = self._http.get(path)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise EngineNotFit(f"--engine {self.url}: GET {path} failed: {e}") from None
        return response
