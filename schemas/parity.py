"""The report of `eval-worker parity`: a serving engine's live speculative decoding of each cached
prompt beside this project's offline chain rounds of the same checkpoint; at T > 0 the engine's own
output paths, registered and captured, walked offline, after a probe of its sampling."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.report import ExpectedRounds
from schemas.sampling import GREEDY, DraftSampling, SamplingParams


class PromptParity(BaseModel):
    """One prompt (at T > 0: one sample of it), alone on the engine: its tokens, live drafts and
    accepted tokens, offline rounds (greedy drafting) or expected rounds (probabilistic drafting)."""

    model_config = ConfigDict(extra="forbid")
    prompt_id: str
    response_tokens: int
    first_token_difference: int | None = Field(
        description="first response position where the engine's greedy token differs from the stored one (None: same)"
    )
    live_drafts: int
    live_accepted: int
    offline_rounds: int | None = Field(description="the chain walk's rounds (None: probabilistic drafting)")
    offline_accepted: int | None = Field(description="the chain walk's accepted drafts (None: probabilistic)")
    agrees: bool | None = Field(description="None: probabilistic drafting, judged over all rounds together")
    why: str = Field(description="what differs, or how they agree")
    seed: int | None = Field(default=None, description="T > 0: the seed of this sample's request")
    registered_prompt_id: str | None = Field(
        default=None, description="T > 0: the engine's output path, registered on the cache server as a sampled one"
    )
    outside_support: int | None = Field(
        default=None, description="T > 0: tokens of that path the target gives zero probability (cache server)"
    )
    expected: ExpectedRounds | None = Field(
        default=None, description="probabilistic drafting: the exact expectation of the live counts on this path"
    )


class ProbeVerdict(BaseModel):
    """Is the engine's speculative sampling lossless? Its outputs at a tiny temperature, judged by the
    target's probability of each token (None: not probed, with the reason)."""

    model_config = ConfigDict(extra="forbid")
    lossless: bool | None
    reason: str
    temperature: float | None = None
    threshold: float | None = Field(
        default=None, description="a token whose tail (p_T of the tokens no more likely, summed) is below this: lossy"
    )
    tokens: int = Field(default=0, description="output tokens judged")
    least_tail: float | None = Field(default=None, description="the smallest tail of a judged token")
    prompt_id: str | None = Field(default=None, description="not lossless: the prompt whose output left")
    registered_prompt_id: str | None = Field(default=None, description="not lossless: that output, registered")
    position: int | None = Field(default=None, description="not lossless: the response position of that token")
    token_id: int | None = None
    probability: float | None = Field(default=None, description="not lossless: that token's p_T")


class DistributionCheck(BaseModel):
    """Probabilistic drafting: the live accepted drafts per round over all rounds against the offline
    expectation over the same paths, with a two-sided test (`eval_worker.parity.distribution`)."""

    model_config = ConfigDict(extra="forbid")
    live_rounds: int
    live_accepted: int = Field(description="capped per sample at the tokens its output kept, as offline counts")
    live_mean: float = Field(description="live accepted drafts per round")
    expected_rounds: float
    expected_accepted: float
    expected_mean: float = Field(description="sum of expected accepted / sum of expected rounds")
    stderr: float = Field(description="of the live mean: per-round standard deviation / sqrt(rounds)")
    z: float | None = Field(description="(live - expected) / stderr (None: stderr 0)")
    confidence: float
    interval: tuple[float, float] = Field(description="where the live mean falls with probability `confidence`")
    detectable: float = Field(description="a shift of the live mean this large is caught with probability `power`")
    power: float
    agrees: bool


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
    sampling: SamplingParams = Field(default=GREEDY, description="the requests' setting (seed: the first sample's)")
    setting: str = Field(default="T=0", description="the sampling setting, as reports group by it")
    samples: int = Field(default=1, description="requests per prompt, sample i seeded seed + i")
    draft_sampling: DraftSampling = "greedy"
    probe: ProbeVerdict | None = Field(default=None, description="T > 0: is the engine's sampling lossless?")
    prompts: list[PromptParity]
    agreeing: int = Field(description="prompts (samples) that agree exactly; probabilistic drafting: see distribution")
    distribution: DistributionCheck | None = Field(default=None, description="probabilistic drafting's test")
    agrees: bool | None = Field(default=None, description="the verdict: every prompt agrees, or the test passes")
    live_tau: float | None
    offline_tau: float | None
