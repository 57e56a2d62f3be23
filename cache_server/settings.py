"""Process settings: every command-line option can also come from `CACHE_SERVER_<OPTION>`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class TinyModelSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_", extra="ignore")
    layers: int = Field(default=8, ge=1)
    hidden: int = Field(default=64, ge=32)
    vocab: int = Field(default=512)
    seed: int = 0


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_", extra="ignore")
    model: Path
    store: Path
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["bfloat16", "float16", "float32"] | None = None  # None: bf16 on GPU, fp32 on CPU
    capture_layers: str = "all"  # "all" or a comma-separated superset of the layers that will be asked for
    batch_tokens: int = Field(default=8192, ge=1)  # tokens per batched target forward
    wait_s: float = Field(default=30.0, gt=0)  # how long GET /hidden waits for a pending prompt
    read_threads: int = Field(default=4, ge=1)
    log_level: str = "info"
    checkpoint_root: Path | None = None  # POST /jobs only takes checkpoints under it; None: jobs refused
    token: SecretStr | None = None  # when set, writes need `Authorization: Bearer <token>`
    job_max_attempts: int = Field(default=3, ge=1, le=100)  # claims per job before it fails

    @field_validator("checkpoint_root")
    @classmethod
    def _root_is_a_directory(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_dir():
            raise ValueError(f"checkpoint_root {str(v)!r} is not an existing directory")
        return v

    @field_validator("token")
    @classmethod
    def _token_not_blank(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("token must not be empty (leave it unset to disable authentication)")
        return v

    @field_validator("capture_layers")
    @classmethod
    def _capture_syntax(cls, v: str) -> str:
        v = v.strip()
        if v != "all":
            try:
                ids = [int(x) for x in v.split(",")]
            except ValueError:
                raise ValueError(f"capture_layers must be 'all' or comma-separated integers, got {v!r}") from None
            if not ids or len(set(ids)) != len(ids):
                raise ValueError(f"capture_layers must list distinct layer ids, got {v!r}")
        return v

    def capture_layer_ids(self, num_layers: int) -> list[int]:
        if self.capture_layers == "all":
            return list(range(num_layers))
        ids = sorted(int(x) for x in self.capture_layers.split(","))
        bad = [k for k in ids if not 0 <= k < num_layers]
        if bad:
            raise ValueError(f"--capture-layers {bad} outside the target's 0..{num_layers - 1}")
        return ids
