"""Settings of `eval-worker`, one model per kind of command. Each field is both a command-line option
(`--poll-interval`) and an environment variable (`EVAL_WORKER_POLL_INTERVAL`), except those marked
environment-only (`CliSuppress`); the command line wins."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, CliSuppress, SettingsConfigDict

from schemas.dtypes import DeviceName, DTypeName


def _server_urls(v: str) -> str:
    if not all(u.strip().startswith(("http://", "https://")) for u in v.split(",")):
        raise ValueError(f"server must be http(s) URLs, comma-separated, got {v!r}")
    return v


class ConnectionSettings(BaseSettings):
    """The cache server to talk to."""

    model_config = SettingsConfigDict(
        env_prefix="EVAL_WORKER_",
        extra="ignore",
        cli_kebab_case=True,
        cli_hide_none_type=True,
        cli_avoid_json=True,
        cli_implicit_flags=True,
    )
    server: str = Field(
        default="http://127.0.0.1:8000",
        description="cache server URL; several, comma-separated, for servers sharing one store: feature "
        "requests are spread over them, everything else goes to the first",
    )
    token: str | None = Field(
        default=None, description="the server's bearer token, for its writes (prefer EVAL_WORKER_TOKEN: ps shows argv)"
    )
    timeout_s: CliSuppress[float] = Field(default=600.0, gt=0, description="how long to wait for pending prompts")

    @field_validator("token")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None  # compose passes an unset variable as ""

    @field_validator("server")
    @classmethod
    def _urls(cls, v: str) -> str:
        return _server_urls(v)

    def server_urls(self) -> list[str]:
        """The servers, the first of which takes everything but feature requests."""
        return [u.strip() for u in self.server.split(",")]


class LookupSettings(ConnectionSettings):
    """`inspect` and `compare`: a cache server to consult only when one is named (flag or environment)."""

    server: str | None = Field(  # type: ignore[assignment]
        default=None, description="also consult this cache server (its target; its finished jobs' reports)"
    )

    @field_validator("server")
    @classmethod
    def _urls(cls, v: str | None) -> str | None:  # type: ignore[override]
        return None if v is None else _server_urls(v)


class SubmitSettings(ConnectionSettings):
    """`submit` and `watch`: where checkpoints live as the server sees them."""

    checkpoint_root: Path | None = Field(
        default=None,
        description="local directory the server knows as its --checkpoint-root; paths are sent relative to it",
    )


class EvaluateSettings(ConnectionSettings):
    """`evaluate`: where and how the drafter runs."""

    device: DeviceName = Field(default="auto", description="where the drafter runs")
    dtype: DTypeName | None = Field(
        default=None, description="drafter math (default: float32 on CPU, the served dtype on a GPU; float32 is exact)"
    )
    feature_cache_gb: float = Field(
        default=8.0, ge=0, description="fetched features kept resident for the next checkpoints (0: none)"
    )
    feature_cache_on_device: bool = Field(
        default=False, description="keep resident features on the drafter's device instead of host RAM"
    )
    heads_cache: Path | None = Field(
        default=None,
        description="directory of the target's heads kept between runs, shared by workers "
        "(default ~/.cache/hidden-state-cache/heads)",
    )
    threads: int | None = Field(
        default=None,
        ge=0,
        description="torch threads for the drafter math on CPU (default: 1, or torch's own when OMP_NUM_THREADS "
        "is set; 0: torch's own, one per core). A drafter's small matrix ops gain little from more "
        "threads and stall badly when other work shares the cores",
    )


class WorkerSettings(EvaluateSettings):
    """`serve`: the job worker's polling and lease."""

    poll_interval: float = Field(default=2.0, gt=0, description="seconds between claims when the queue is empty")
    lease_s: float = Field(default=60.0, gt=0, description="a job's lease, renewed every lease_s / 3 while working")
    name: str | None = Field(default=None, description="worker name recorded on jobs (default host:pid)")
    max_batch_jobs: int = Field(
        default=1, ge=1, le=64, description="queued jobs claimed at once and evaluated in one pass over the prompts"
    )
