"""An in-process OpenAI-compatible test engine that parity can be pointed at: a target directory and a
drafter served on loopback with live speculative sampling (`testing.speculative_sampling`), one request
at a time, and vLLM's speculative-decoding counters in `/metrics`.

`lossless=False` breaks it as a real engine can break: the rejection sampler verifies against the
target at temperature 1 whatever the request asks (the first token, from the plain sampler, is still
right), so at a tiny temperature the output leaves the target's greedy path."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import AutoModelForCausalLM

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from schemas.sampling import DraftSampling, SamplingParams
from testing.servers import serving_app
from testing.speculative_sampling import SampledRun, speculative_sample

VERSION = "spec-engine-test"
FinishReason = Literal["length", "stop"]


class CompletionRequest(BaseModel):
    """The `POST /v1/completions` fields this engine honours (any other field is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: list[int] = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = 1.0  # vLLM's default
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)

    def sampling(self) -> SamplingParams:
        """The request's SamplingParams; T > 0 without a seed gets a fresh one (vLLM: unseeded is random)."""
        seed = None if self.temperature == 0 else self.seed
        if self.temperature > 0 and seed is None:
            seed = random.SystemRandom().getrandbits(62)
        top_k = max(self.top_k, 0)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=top_k, min_p=self.min_p, seed=seed)


class SpecCounters:
    """vLLM's `vllm:spec_decode_*` counters (`vllm/v1/spec_decode/metrics.py`), labelled as vLLM labels them."""

    def __init__(self, model_name: str, k: int) -> None:
        self.registry = CollectorRegistry()
        labels, values = ["model_name", "engine"], (model_name, "0")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(*values)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(*values)
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(*values)
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*labels, "position"],
            registry=self.registry,
        )
        self.per_position = [per_pos.labels(*values, str(i)) for i in range(k)]

    def observe(self, run: SampledRun, k: int) -> None:
        """Count a finished request's rounds: each one a draft of K tokens."""
        self.drafts.inc(run.rounds)
        self.draft_tokens.inc(run.rounds * k)
        self.accepted.inc(sum(run.accepted))
        for i, counter in enumerate(self.per_position):
            counter.inc(sum(a > i for a in run.accepted))

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class SpecCompletions:
    """The engine without HTTP: a target (fp32, CPU), a drafter, K, and counters; one request at a time."""

    def __init__(
        self,
        target_dir: Path,
        drafter: LoadedCheckpoint | DFlashDrafter | Eagle3Drafter,
        *,
        k: int,
        layer_ids: Sequence[int] | None = None,
        draft_sampling: DraftSampling = "greedy",
        lossless: bool = True,
    ) -> None:
        if isinstance(drafter, LoadedCheckpoint):
            layer_ids = drafter.target_layer_ids
            module = drafter.drafter
            if not isinstance(module, DFlashDrafter | Eagle3Drafter):
                raise TypeError(f"the test engine drafts with DFlash or EAGLE-3, not {type(module).__name__}")
            drafter = module
        if layer_ids is None:
            raise ValueError("a drafter module needs its target layer ids (decoder outputs)")
        self.name = target_dir.name
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        self.drafter, self.layer_ids, self.k = drafter.eval(), tuple(layer_ids), k
        self.draft_sampling, self.lossless = draft_sampling, lossless
        self.counters = SpecCounters(self.name, k)
        self._lock = threading.Lock()

    def eos_ids(self) -> set[int]:
        """The target's EOS ids (its generation config's, else its config's)."""
        found = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        found = found if found is not None else getattr(self.target.config, "eos_token_id", None)
        return set() if found is None else {found} if isinstance(found, int) else set(found)

    def complete(self, request: CompletionRequest) -> dict[str, Any]:
        """Generate one completion and count its rounds; the answer vLLM's completions API gives."""
        params = request.sampling()
        # the lossy engine's bug: verification at temperature 1, whatever the request's temperature
        verify = None if self.lossless or params.greedy else params.model_copy(update={"temperature": 1.0})
        stops = set(request.stop_token_ids) | (set() if request.ignore_eos else self.eos_ids())
        with self._lock:
            run = speculative_sample(
                self.target,
                self.drafter,
                request.prompt,
                request.max_tokens,
                self.layer_ids,
                params,
                k=self.k,
                draft_sampling=self.draft_sampling,
                stop_token_ids=stops,
                verify_params=verify,
            )
            self.counters.observe(run, self.k)
        generated = run.token_ids[run.prompt_len :]
        finish: FinishReason = "stop" if generated and generated[-1] in stops else "length"
        # vLLM names a stop token of the request in stop_reason; EOS and length leave it null
        stop_reason = generated[-1] if finish == "stop" and generated[-1] in request.stop_token_ids else None
        choice = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": stop_reason}
        if request.return_token_ids:
            choice |= {"token_ids": generated, "prompt_token_ids": list(request.prompt)}
        usage = {"prompt_tokens": run.prompt_len, "completion_tokens": len(generated)}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "usage": usage | {"total_tokens": len(run.token_ids)},
        }


def create_app(engine: SpecCompletions) -> FastAPI:
    """The FastAPI app over `engine`: `/v1/models`, `/version`, `/health`, `/v1/completions`, `/metrics`."""
    app = FastAPI(title=VERSION)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}}, status)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": engine.name, "object": "model", "owned_by": VERSION}]}

    @app.get("/version")
    def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(engine.counters.text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", response_model=None)
    def completions(request: CompletionRequest) -> dict[str, Any] | JSONResponse:  # sync: runs in a worker thread
        if request.model not in (None, engine.name):
            return error(404, f"The model `{request.model}` does not exist.")
        try:
            return engine.complete(request)
        except (ValidationError, ValueError) as e:
            return error(400, str(e))

    return app


@contextmanager
def spec_engine(engine: SpecCompletions) -> Iterator[str]:
    """`engine` served on a free loopback port: its base URL while the context is open."""
    with serving_app(create_app(engine)) as url:
        yield url
