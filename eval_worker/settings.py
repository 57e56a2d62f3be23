"""Eval-worker settings: every command-line option can also come from `EVAL_WORKER_<OPTION>`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EVAL_WORKER_", extra="ignore")
    server: str = "http://127.0.0.1:8000"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # drafter math; fp32 keeps tau exact
    heads_cache: Path | None = None  # default ~/.cache/hidden-state-cache/heads
    token: str | None = None  # bearer token for the server's write endpoints
    timeout_s: float = Field(default=600.0, gt=0)  # how long to wait for pending prompts
    # `eval-worker serve` (the job worker):
    poll_interval: float = Field(default=2.0, gt=0)  # seconds between claims when the queue is empty
    lease_s: float = Field(default=60.0, gt=0)  # a job's lease; renewed every lease_s / 3 while working
    name: str | None = None  # worker name recorded on jobs; default host:pid
    # `submit` / `watch`: the local directory the server knows as its --checkpoint-root
    checkpoint_root: Path | None = None

    @field_validator("token")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None  # compose passes an unset variable as ""
