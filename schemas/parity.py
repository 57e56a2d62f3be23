"""The report of `eval-worker parity`: a serving engine's live speculative decoding of each cached
prompt beside this project's offline chain rounds of the same checkpoint."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PromptParity(BaseModel):
    """One prompt, alone on the engine: its tokens, live drafts and accepted tokens, offline rounds."""

    model_config = ConfigDict(extra="forbid")
    prompt_id: str
    response_tokens: int
    first_token_difference: int | None = Field(
        description="first response position where the engine's greedy token differs from the stored one (None: same)"
    )
    live_drafts: int
    live_accepted: int
    offline_rounds: int
    offline_accepted: int
    agrees: bool
    why: str = Field(description="what differs, or how they agree")


class ParityReport(BaseModel):
    """Every prompt, and the same averaging on both sides: tau = 1 + accepted / drafts over all rounds."""

    model_config = ConfigDict(extra="forbid")
    checkpoint_path: str
    drafter_family: str
    speculative_tokens: int
    engine_url: str
    engine_model: str
    engine_version: str | None
    target_fingerprint: str
    feature_storage: str = Field(default="exact", description="how the offline side's features were stored")
    prompts: list[PromptParity]
    agreeing: int
    live_tau: float | None
    offline_tau: float | None
