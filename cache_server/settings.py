"""Settings of `cache-server`: each field is both a command-line option (`--capture-layers`) and an
environment variable (`CACHE_SERVER_CAPTURE_LAYERS`); the command line wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.dtypes import DeviceName, DTypeName
from schemas.layers import layer_list_problem, parse_layer_list
from schemas.storage import StorageName

_CLI = {"cli_kebab_case": True, "cli_hide_none_type": True, "cli_avoid_json": True, "cli_implicit_flags": True}


class TinyModelSettings(BaseSettings):
    """`cache-server tiny-model DIR`: the shape of a small random Qwen3 target."""

    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_TINY_", extra="ignore", **_CLI)  # type: ignore[typeddict-item]
    layers: int = Field(default=8, ge=1, description="decoder layers")
    hidden: int = Field(default=64, ge=32, description="hidden size (a multiple of 16)")
    vocab: int = Field(default=512, description="vocabulary size")
    head_dim: int = Field(default=16, description="attention head width (32 or more for vLLM's CPU attention)")
    seed: int = Field(default=0, description="random seed of the weights")
    logit_scale: float = Field(default=1.0, gt=0, description="lm_head multiplier: 8 peaks the next-token distribution")


class PlanSettings(BaseSettings):
    """`cache-server plan`: what a capture would store, before it starts (no server, no weights loaded)."""

    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_PLAN_", extra="ignore", **_CLI)  # type: ignore[typeddict-item]
    model: Path = Field(description="Hugging Face model directory of the target (its config.json is read)")
    prompts: int = Field(ge=1, description="prompts to capture")
    tokens: int = Field(ge=1, description="tokens per prompt, prompt and response together")
    capture_layers: str = Field(default="all", description="'all' or the comma-separated layers to store")
    dtype: DTypeName = Field(default="bfloat16", description="the target's dtype (a server on GPU runs bf16)")
    store_dtype: StorageName = Field(default="exact", description="'exact', or 'float8_e4m3fn' (per-token scales)")
    store: Path | None = Field(default=None, description="a local store directory, for its free space")


class PruneSettings(BaseSettings):
    """`cache-server prune`: drop stored layers outside a set, beside running servers (no target loaded)."""

    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_PRUNE_", extra="ignore", **_CLI)  # type: ignore[typeddict-item]
    store: str = Field(description="the store: a directory or s3://bucket/prefix")
    keep_layers: str = Field(description="the comma-separated layers to keep (GET /layers/usage: what jobs read)")
    namespace: str | None = Field(default=None, description="the target fingerprint to prune (default: the only one)")
    prompts: str | None = Field(default=None, description="comma-separated prompt ids (default: every stored prompt)")
    set: str | None = Field(default=None, description="prune only the prompts of this set")
    db: str | None = Field(
        default=None,
        description="the coordination database shared by every server on the store (the prune takes each "
        "prompt's capture lease there): postgresql://user:pass@host/db, a SQLite path or sqlite:///path "
        "(default: coordination.sqlite in a local store; required with an s3:// store)",
    )
    grace_s: float = Field(
        default=30.0,
        ge=0,
        description="dropped layers' files are deleted this long after their manifests no longer "
        "list them, so that reads begun before finish",
    )
    usage_days: float = Field(
        default=30.0,
        gt=0,
        description="jobs done this many days back count as reading their layers, as GET /layers/usage?days= "
        "counts them (queued and running jobs always count)",
    )
    force: bool = Field(
        default=False,
        description="drop layers that jobs read all the same (without it, prune refuses and names them)",
    )


class ServeSettings(BaseSettings):
    """`cache-server serve`: the target, the store, the HTTP address and the compute budget."""

    model_config = SettingsConfigDict(env_prefix="CACHE_SERVER_", extra="ignore", **_CLI)  # type: ignore[typeddict-item]
    model: Path = Field(description="Hugging Face model directory of the target")
    store: str = Field(
        description="the Zarr hidden-state store: a directory or s3://bucket/prefix (endpoint and credentials "
        "from the AWS_* environment variables)"
    )
    db: str | None = Field(
        default=None,
        description="the coordination database shared by every server on the store: postgresql://user:pass@host/db, "
        "a SQLite path or sqlite:///path (default: coordination.sqlite in a local store; required with an s3:// store)",
    )
    db_lock_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a SQLite statement waits for another process's lock before it fails (and a "
        "database that stays locked shows on /healthz)",
    )
    instance: str | None = Field(
        default=None, description="this server's name among those sharing the store (default: <host>-<pid>)"
    )
    capture_lease_s: float = Field(
        default=30.0, gt=0, description="a capture held by a server that stops renewing it is taken over after this"
    )
    stored_bytes_refresh_s: float = Field(
        default=60.0,
        ge=0,
        description="/metrics' stored bytes per namespace and layer are rescanned at most this often",
    )
    read_only: bool = Field(
        default=False,
        description="never write the store: serve what is stored, refuse registrations and captures (403 "
        "store_read_only); a local store that refuses a write probe at start is served so anyway",
    )
    orphan_grace_s: float = Field(
        default=900.0, ge=0, description="unpublished store objects older than this are removed on start"
    )
    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(default=8000, ge=0, le=65535, description="port")
    device: DeviceName = Field(default="auto", description="where the target runs")
    dtype: DTypeName | None = Field(default=None, description="target dtype (default: bf16 on GPU, fp32 on CPU)")
    store_dtype: StorageName = Field(
        default="exact",
        description="how states are stored: 'exact' (the target dtype's bytes, lossless) or 'float8_e4m3fn' "
        "(FP8 with one scale per token, half the bytes of bf16, in a namespace of its own; /hidden says so)",
    )
    capture_layers: str = Field(
        default="all", description="'all' or a comma-separated superset of the layers that will be asked for"
    )
    batch_tokens: int = Field(default=8192, ge=1, description="tokens per batched target forward")
    generator: str = Field(
        default="hf",
        description="who generates responses: 'hf' (the target in-process) or the URL of an OpenAI-compatible "
        "engine serving the same model (vllm serve, sglang), asked for token ids",
    )
    capture: Literal["hf", "engine"] = Field(
        default="hf",
        description="who computes the layers: 'hf' (the target's transformers forward in this process) or "
        "'engine' (the --generator engine's own forward, written by its hidden-states connector into "
        "--engine-files; this server then loads the tokenizer and heads only)",
    )
    engine_files: Path | None = Field(
        default=None,
        description="--capture engine: the directory the engine's connector writes (its shared_storage_path, "
        "as mounted here)",
    )
    generator_model: str | None = Field(
        default=None, description="the engine's model name (default: its only one, or the one named like the target)"
    )
    generator_concurrency: int = Field(default=64, ge=1, description="generation requests in flight on the engine")
    generator_timeout_s: float = Field(default=600.0, gt=0, description="how long one engine request may take")
    generate_batch: int = Field(default=16, ge=1, description="sequences per in-process generate call (hf)")
    device_map: str | None = Field(
        default=None,
        description="spread the target over devices: 'auto' (every GPU of the node) or a JSON map of module "
        "names to devices, as transformers' device_map; --device is then ignored",
    )
    wait_s: float = Field(default=30.0, gt=0, description="how long GET /hidden waits for a pending prompt")
    unhealthy_after_s: float = Field(
        default=30.0, gt=0, description="GET /healthz answers 503 once a background loop has failed this long"
    )
    read_threads: int = Field(default=4, ge=1, description="threads decoding stored chunks")
    stream_hidden: bool = Field(
        default=True,
        description="send /hidden in row blocks while the next ones decode (--no-stream-hidden: one buffer)",
    )
    ram_cache_gb: float = Field(
        default=0.0, ge=0, description="decoded layers kept in RAM so that repeated requests decode nothing (0: off)"
    )
    log_level: str = Field(default="info", description="debug, info, warning or error")
    checkpoint_root: Path | None = Field(
        default=None, description="directory whose checkpoints POST /jobs may evaluate (default: jobs refused)"
    )
    token: SecretStr | None = Field(
        default=None, description="bearer token required on writes (prefer CACHE_SERVER_TOKEN: ps shows argv)"
    )
    job_max_attempts: int = Field(default=3, ge=1, le=100, description="claims per job before it fails")

    @field_validator("store", mode="before")
    @classmethod
    def _store_location(cls, v: object) -> object:
        v = str(v) if isinstance(v, Path) else v
        if isinstance(v, str) and "://" in v and not v.startswith("s3://"):
            raise ValueError(f"store must be a directory or an s3://bucket/prefix URL, got {v!r}")
        return v

    @field_validator("generator")
    @classmethod
    def _generator_is_hf_or_url(cls, v: str) -> str:
        v = v.strip()
        if v != "hf" and not v.startswith(("http://", "https://")):
            raise ValueError(f"generator must be 'hf' or an http(s):// URL of an engine, got {v!r}")
        return v

    @field_validator("device_map")
    @classmethod
    def _device_map_syntax(cls, v: str | None) -> str | None:
        if v is None or v.strip() == "auto":
            return v if v is None else "auto"
        try:
            parsed = json.loads(v)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict) or not all(isinstance(d, (str, int)) for d in parsed.values()):
            raise ValueError(f"device_map must be 'auto' or a JSON object of module name -> device, got {v!r}")
        return v

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
            ids = parse_layer_list(v, "capture_layers")
            if not ids or len(set(ids)) != len(ids):
                raise ValueError(f"capture_layers must be 'all' or distinct layer ids, got {v!r}")
        return v

    @model_validator(mode="after")
    def _engine_capture(self) -> ServeSettings:
        if self.capture == "engine" and (self.generator == "hf" or self.engine_files is None):
            raise ValueError("--capture engine needs --generator URL (the engine) and --engine-files DIR (its files)")
        if self.capture == "engine" and self.device_map is not None:
            raise ValueError("--device-map places the in-process target; with --capture engine the engine places it")
        if self.capture == "hf" and self.engine_files is not None:
            raise ValueError("--engine-files is read by --capture engine only")
        return self

    def capture_layer_ids(self, num_layers: int) -> list[int]:
        """The layers to store for every prompt of an `num_layers`-layer target."""
        return capture_layer_ids(self.capture_layers, num_layers)


def capture_layer_ids(text: str, num_layers: int) -> list[int]:
    """`--capture-layers` ('all' or a layer list) for an `num_layers`-layer target."""
    if text == "all":
        return list(range(num_layers))
    ids = sorted(parse_layer_list(text))
    problem = layer_list_problem(ids, num_layers)
    if problem is not None:
        raise ValueError(f"--capture-layers: {problem}")
    return ids
