"""Checkpoint evaluation jobs: the bodies of `/jobs` and of the worker protocol (claim, renew, ...)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.eval_spec import EvalSpec, distinct
from schemas.layers import CheckpointLayerConvention
from schemas.report import EvalReport
from schemas.sampling import DraftSampling

MAX_PROMPT_IDS = 10000
MAX_LEASE_S = 86400.0
MAX_ERROR_CHARS = 20000


class JobStatus(StrEnum):
    """Where a job is in its life: queued -> running -> done or failed (a retryable failure queues it
    again while attempts remain); `DELETE` of a running job makes it cancelling until its worker stops
    (at its next renewal), then cancelled. done, failed and cancelled are final."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    cancelling = "cancelling"
    cancelled = "cancelled"


FINISHED = (JobStatus.done, JobStatus.failed, JobStatus.cancelled)


class JobProgress(BaseModel):
    """How far a running job's worker has walked its prompts, sent with each lease renewal."""

    model_config = ConfigDict(extra="forbid")
    prompts_walked: int = Field(ge=0, description="prompts every walk of the job has finished")
    prompts_total: int = Field(ge=0, description="the job's prompts")
    rounds: int = Field(ge=0, description="drafter rounds (blocks drafted) so far, all walks together")
    elapsed_s: float = Field(ge=0, description="seconds since the walking began")
    eta_s: float | None = Field(
        default=None, ge=0, description="seconds left at the rate so far (None until a prompt is walked)"
    )
    reported_at: datetime | None = Field(default=None, description="when the server received it (set by it)")

    @model_validator(mode="after")
    def _walked_of_total(self) -> JobProgress:
        if self.prompts_walked > self.prompts_total:
            raise ValueError(f"prompts_walked {self.prompts_walked} exceeds prompts_total {self.prompts_total}")
        return self


class JobSubmit(EvalSpec):
    """`POST /jobs`: evaluate one drafter checkpoint on cached prompts, with every option `eval-worker
    evaluate` has (the `EvalSpec` this body extends; flat family fields of older clients are lifted
    into their family's block)."""

    model_config = ConfigDict(extra="forbid")
    checkpoint: str = Field(min_length=1, max_length=4096, description="path inside --checkpoint-root")
    prompts: Literal["all"] | list[str] = Field(
        default="all", description='"all": every prompt registered (and not failed) when the job is claimed'
    )

    @model_validator(mode="after")
    def _prompts_or_sets(self) -> JobSubmit:
        if self.sets and self.prompts != "all":
            raise ValueError('sets choose the prompts: give prompts "all" (the default) with them, or prompt ids alone')
        return self

    @field_validator("prompts", mode="before")
    @classmethod
    def _prompts(cls, v: object) -> object:
        if isinstance(v, str) and v != "all":
            raise ValueError(f'prompts must be "all" or a list of prompt ids, got {v!r}')
        if isinstance(v, list):
            if not v:
                raise ValueError('prompts must not be empty (use "all" for every registered prompt)')
            if len(v) > MAX_PROMPT_IDS:
                raise ValueError(f"at most {MAX_PROMPT_IDS} prompt ids per job, got {len(v)}")
            if all(isinstance(p, str) for p in v):
                if not all(v):
                    raise ValueError("prompt ids must not be empty strings")
                distinct(v, "prompt ids")
        return v

    def eval_spec(self) -> EvalSpec:
        """The evaluation this job asks for, without which checkpoint and prompts."""
        return EvalSpec.model_validate(self.model_dump(include=set(EvalSpec.model_fields)))


# JobState's flat copies of its spec, as servers before the spec column sent them.
_FLAT = (
    "tree_budgets",
    "target_layer_ids",
    "block_size",
    "steps",
    "eagle_trees",
    "layer_convention",
    "sets",
    "draft_sampling",
)


def flat_fields(spec: EvalSpec) -> dict[str, Any]:
    """A spec's options as the flat fields of `JobState` (None or empty where its family has none)."""
    block = spec.family_options
    return {
        "tree_budgets": list(getattr(block, "tree_budgets", [])),
        "target_layer_ids": spec.target_layer_ids,
        "block_size": getattr(block, "block_size", None),
        "steps": getattr(block, "steps", None),
        "eagle_trees": list(getattr(block, "eagle_trees", [])),
        "layer_convention": getattr(block, "layer_convention", None),
        "sets": list(spec.sets),
        "draft_sampling": spec.draft_sampling,
    }


_COPY = "a copy of `spec`'s, for clients that read it before the spec existed"


class JobState(BaseModel):
    """`GET /jobs/{id}`. `checkpoint` is the resolved absolute path the worker opens."""

    job_id: str
    status: JobStatus
    checkpoint: str
    checkpoint_relative: str = Field(description="the checkpoint's path relative to --checkpoint-root")
    prompts: Literal["all"] | list[str]
    spec: EvalSpec = Field(description="what the job evaluates: every option of `eval-worker evaluate`")
    tree_budgets: list[int] = Field(default_factory=list, description=f"{_COPY} (DFlash)")
    target_layer_ids: list[int] | None = Field(default=None, description=_COPY)
    block_size: int | None = Field(default=None, description=f"{_COPY} (DFlash)")
    steps: int | None = Field(default=None, description=f"{_COPY} (EAGLE-3, MTP)")
    eagle_trees: list[str] = Field(default_factory=list, description=f"{_COPY} (EAGLE-3)")
    layer_convention: CheckpointLayerConvention | None = Field(default=None, description=f"{_COPY} (EAGLE-3)")
    sets: list[str] = Field(default_factory=list, description=_COPY)
    draft_sampling: DraftSampling = Field(default="greedy", description=_COPY)
    target_fingerprint: str | None = Field(description="the target the server served at submission")
    attempts: int = Field(description="claims so far, the current one included")
    max_attempts: int
    worker: str | None = Field(description="the worker of the latest claim")
    created_at: datetime
    started_at: datetime | None = Field(description="time of the latest claim")
    finished_at: datetime | None
    lease_expires_at: datetime | None = Field(description="set while running")
    error: str | None = Field(description="the latest failure; kept across retries, cleared when done")
    progress: JobProgress | None = Field(
        default=None, description="the walk so far, as the worker last reported it (None before its first report)"
    )

    @model_validator(mode="before")
    @classmethod
    def _flat_from_spec(cls, data: Any) -> Any:
        """The flat fields are always the spec's; a state without a spec (an older server's) gets the
        spec its flat fields mean."""
        if not isinstance(data, dict):
            return data
        spec = data.get("spec")
        if spec is None:
            spec = EvalSpec.model_validate({k: data[k] for k in _FLAT if k in data})
        elif not isinstance(spec, EvalSpec):
            spec = EvalSpec.model_validate(spec)
        return {**data, "spec": spec, **flat_fields(spec)}


class JobPage(BaseModel):
    """One page of `GET /jobs`."""

    jobs: list[JobState]
    total: int
    offset: int
    limit: int


class ClaimRequest(BaseModel):
    """`POST /jobs/claim`: who claims, and for how long."""

    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=256)
    lease_s: float = Field(gt=0, le=MAX_LEASE_S)


class Claim(BaseModel):
    """A claimed job and the lease that renew/complete/fail must quote."""

    job: JobState
    lease: str
    prompt_ids: list[str] = Field(
        description="the job's prompt ids; for 'all', every prompt registered (and not failed) when the job was "
        "claimed, of the job's sets when it names some"
    )
    set_members: dict[str, list[str]] = Field(
        default_factory=dict, description="each of the job's sets: its prompt ids (for the report's per-set split)"
    )


class RenewRequest(BaseModel):
    """`POST /jobs/{id}/renew`."""

    model_config = ConfigDict(extra="forbid")
    lease: str = Field(min_length=1)
    lease_s: float | None = Field(default=None, gt=0, le=MAX_LEASE_S, description="default: the claim's")
    progress: JobProgress | None = Field(default=None, description="the walk so far, shown in the job's state")


class CompleteRequest(BaseModel):
    """`POST /jobs/{id}/complete`: the job's one report."""

    model_config = ConfigDict(extra="forbid")
    lease: str = Field(min_length=1)
    report: EvalReport


class FailRequest(BaseModel):
    """`POST /jobs/{id}/fail`: what went wrong, and whether another attempt may help."""

    model_config = ConfigDict(extra="forbid")
    lease: str = Field(min_length=1)
    error: str = Field(min_length=1, description=f"kept to its last {MAX_ERROR_CHARS} characters")
    retryable: bool

    @field_validator("error")
    @classmethod
    def _tail(cls, v: str) -> str:
        return v if len(v) <= MAX_ERROR_CHARS else "..." + v[-MAX_ERROR_CHARS:]


class JobReport(BaseModel):
    """A done job and its report's summaries (`prompts` left out: per-prompt rounds are in
    `GET /jobs/{id}/report`)."""

    job_id: str
    checkpoint_relative: str
    finished_at: datetime | None
    report: EvalReport


class JobReportPage(BaseModel):
    """`GET /jobs/reports`: one page of done jobs' report summaries, in submission order."""

    reports: list[JobReport]
    total: int
    offset: int
    limit: int
