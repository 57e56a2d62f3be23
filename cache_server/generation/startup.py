"""The checks an engine passes before it generates any response: it answers, serves one model with
token ids, and that model's greedy tokens for a fixed probe prompt are the in-process target's."""

from __future__ import annotations

import logging

from cache_server.capture.target import Target
from cache_server.generation.engine import EngineClient, EngineUnfit, connect, generate_once
from schemas.prompts import PromptSpec

log = logging.getLogger(__name__)

PROBE_TEXT = "Speculative decoding drafts several tokens and lets the target verify them."
PROBE_TOKENS = 8


def checked_engine(url: str, target: Target, *, model: str | None, timeout_s: float, concurrency: int) -> EngineClient:
    """A client for the engine at `url`; EngineUnfit (one line, naming both models) unless the engine
    generates the target's own greedy tokens for the probe."""
    if target.forward is None:
        raise ValueError("the probe compares the engine with the target's in-process forward, and this target has none")
    stops = target.prompts.stop_token_ids
    engine = connect(url, model=model, target_name=target.info.name, stop_token_ids=stops, timeout_s=timeout_s)
    probe = target.prompts.encode(PromptSpec(text=PROBE_TEXT))
    theirs = generate_once(engine, probe, PROBE_TOKENS, timeout_s=timeout_s)
    ours = target.forward.generate([probe], PROBE_TOKENS)[0]
    if theirs != ours:
        raise EngineUnfit(
            f"--generator {engine.url} serves {engine.model!r}, whose greedy tokens for the probe prompt differ "
            f"from target {target.info.name!r} ({target.info.fingerprint}): engine {theirs} vs target {ours}"
        )
    log.info("responses from %s (%s, vLLM/SGLang %s): probe tokens agree", engine.url, engine.model, engine.version)
    return EngineClient(engine, timeout_s=timeout_s, concurrency=concurrency)
