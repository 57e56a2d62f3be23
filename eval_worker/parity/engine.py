"""A running vLLM as parity reads it: the model it serves, greedy or seeded sampled generation from token
ids, and its speculative-decoding counters (`vllm:spec_decode_*` in its Prometheus `/metrics`, per draft
position too), whose deltas give one request's rounds when requests run one at a time."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from schemas.completions import completion_body, completion_token_ids
from schemas.prompts import GeneratorInfo
from schemas.sampling import SamplingParams

_COUNTER = re.compile(r"^vllm:spec_decode_(num_drafts|num_accepted_tokens)_total\{[^}]*\} ([0-9.e+]+)$", re.M)
_PER_POSITION = re.compile(
    r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} ([0-9.e+]+)$', re.M
)


class EngineNotFit(ValueError):
    """The engine cannot answer parity: unreachable, another model, or no speculative decoding."""


@dataclass(frozen=True)
class SpecCounters:
    """The engine's running totals: draft rounds, accepted draft tokens, and per draft position j the
    rounds that accepted position j (so: the rounds that accepted more than j drafts)."""

    drafts: int
    accepted: int
    per_position: tuple[int, ...] = ()

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        before = other.per_position + (0,) * (len(self.per_position) - len(other.per_position))
        per_position = tuple(a - b for a, b in zip(self.per_position, before, strict=False))
        return SpecCounters(self.drafts - other.drafts, self.accepted - other.accepted, per_position)


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
        positions = {int(p) for p, _ in _PER_POSITION.findall(text)}
        if not _COUNTER.search(text) or not positions:
            raise EngineNotFit(
                f"--engine {self.url} reports no speculative-decoding counters in /metrics: start it with "
                "--speculative-config naming this checkpoint"
            )
        return max(positions) + 1

    def counters(self) -> SpecCounters:
        """The running totals now."""
        text = self._get("/metrics").text
        found = dict(_COUNTER.findall(text))
        positions = {int(p): int(float(v)) for p, v in _PER_POSITION.findall(text)}
        return SpecCounters(
            int(float(found.get("num_drafts", 0))),
            int(float(found.get("num_accepted_tokens", 0))),
            tuple(positions.get(j, 0) for j in range(max(positions, default=-1) + 1)),
        )

    def settled_counters(self, timeout_s: float = 5.0) -> SpecCounters:
        """The counters once two reads 0.1 s apart agree (the engine records a request's stats as it ends)."""
        last, deadline = self.counters(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.counters()
            if now == last:
                return now
            last = now
        return last

    def generator(self) -> GeneratorInfo:
        """What made the engine's outputs, as a registered response records it."""
        return GeneratorInfo(kind="engine", url=self.url, model=self.model, version=self.version)

    def greedy(self, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Exactly `max_tokens` greedy tokens after `prompt_ids` (EOS ignored), as token ids."""
        return self.sample(prompt_ids, max_tokens, None)

    def sample(self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None) -> list[int]:
        """Exactly `max_tokens` tokens after `prompt_ids` (EOS ignored), greedy (`sampling` None or T = 0)
        or sampled at `sampling`'s setting with its seed, as token ids."""
        body = completion_body(self.model, prompt_ids, max_tokens, sampling=sampling)
        try:
            response = self._http.post("/v1/completions", json=body)
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
