"""The error contract: every error body is `{"error": {"code", "message"}}`, and every code has one
HTTP status, written next to it here. The server raises by code, the client maps codes back to
exception classes, and the OpenAPI document declares them per route, all from this table."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class ErrorCode(StrEnum):
    """Every `error.code` the server sends."""

    # 422: bad input the caller can fix
    invalid_request = "invalid_request"
    invalid_prompt = "invalid_prompt"
    invalid_layers = "invalid_layers"
    unknown_prompts = "unknown_prompts"
    unknown_sets = "unknown_sets"
    invalid_checkpoint_path = "invalid_checkpoint_path"
    storage_exceeded = "storage_exceeded"  # a registration would take a local store past its free space
    # 400: a request the HTTP parser could not read (e.g. a request line over its limit)
    bad_http_request = "bad_http_request"
    # 401 / 403: access
    unauthorized = "unauthorized"
    jobs_disabled = "jobs_disabled"
    store_read_only = "store_read_only"  # the server's store is read-only: it registers and captures nothing
    # 404: nothing there (yet)
    not_found = "not_found"
    prompt_not_found = "prompt_not_found"
    job_not_found = "job_not_found"
    report_not_ready = "report_not_ready"
    # 405
    method_not_allowed = "method_not_allowed"
    # 409: the resource is in a state that refuses the request
    prompt_failed = "prompt_failed"
    job_failed = "job_failed"
    lease_lost = "lease_lost"
    # 503: still computing; Retry-After says when to ask again
    prompt_not_ready = "prompt_not_ready"
    # 503: stored bytes of the prompt do not decode; its bad layers are captured again (Retry-After)
    stored_data_corrupt = "stored_data_corrupt"
    # 503: a background loop of the server is dead or failing (GET /healthz)
    server_unhealthy = "server_unhealthy"
    # 500: a bug, logged on the server; the body carries no internals
    internal_error = "internal_error"
    # any other status the HTTP framework produces
    http_error = "http_error"

    @property
    def status(self) -> int:
        """The HTTP status this code is always sent with."""
        return STATUS[self]


STATUS: dict[ErrorCode, int] = {
    ErrorCode.invalid_request: 422,
    ErrorCode.invalid_prompt: 422,
    ErrorCode.unknown_sets: 422,
    ErrorCode.invalid_layers: 422,
    ErrorCode.unknown_prompts: 422,
    ErrorCode.invalid_checkpoint_path: 422,
    ErrorCode.storage_exceeded: 422,
    ErrorCode.bad_http_request: 400,
    ErrorCode.unauthorized: 401,
    ErrorCode.jobs_disabled: 403,
    ErrorCode.store_read_only: 403,
    ErrorCode.not_found: 404,
    ErrorCode.prompt_not_found: 404,
    ErrorCode.job_not_found: 404,
    ErrorCode.report_not_ready: 404,
    ErrorCode.method_not_allowed: 405,
    ErrorCode.prompt_failed: 409,
    ErrorCode.job_failed: 409,
    ErrorCode.lease_lost: 409,
    ErrorCode.prompt_not_ready: 503,
    ErrorCode.stored_data_corrupt: 503,
    ErrorCode.server_unhealthy: 503,
    ErrorCode.internal_error: 500,
    ErrorCode.http_error: 500,
}


class ErrorDetail(BaseModel):
    """What went wrong: a stable machine-readable code and a message for people."""

    model_config = ConfigDict(extra="forbid")
    code: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail
