"""Checkpoint evaluation jobs: the bodies of `/jobs` and of the worker protocol (claim, renew, ...)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.eval_spec import EvalSpec, distinct
from schemas.layers import CheckpointLayerConvention
from schemas.report import EvalReport
from schemas.sampling import DraftSampling

MAX_PROMPT_IDS = 10000
MAX_LEASE_S = 86400.0
MAX_ERROR_CHARS = 20000


class JobStatus(StrEnum):
    """Where a job is in its life."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


class JobSubmit(EvalSpec):
    """`POST /jobs`: evaluate one drafter checkpoint on cached prompts (the worker's options)."""

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


class JobState(BaseModel):
    """`GET /jobs/{id}`. `checkpoint` is the resolved absolute path the worker opens."""

    job_id: str
    status: JobStatus
    checkpoint: str
    checkpoint_relative: str = Field(description="the checkpoint's path relative to --checkpoint-root")
    prompts: Literal["all"] | list[str]
    tree_budgets: list[int]
    target_layer_ids: list[int] | None
    block_size: int | None
    steps: int | None = None
    eagle_trees: list[str] = Field(default_factory=list)
    layer_convention: CheckpointLayerConvention | None = None
    sets: list[str] = Field(default_factory=list)
    draft_sampling: DraftSampling = "greedy"
    target_fingerprint: str | None = Field(description="the target the server served at submission")
    attempts: int = Field(description="claims so far, the current one included")
    max_attempts: int
    worker: str | None = Field(description="the worker of the latest claim")
    created_at: datetime
    started_at: datetime | None = Field(description="time of the latest claim")
    finished_at: datetime | None
    lease_expires_at: datetime | None = Field(description="set while running")
    error: str | None = Field(description="the latest failure; kept across retries, cleared when done")


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
