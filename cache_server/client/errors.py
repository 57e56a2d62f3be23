"""The client's errors: one tree, and one table from the server's error codes to its classes.

CacheClientError
├── ServerUnreachable           no connection to the server
├── ProtocolError               a response that is not what the API promises
└── ApiError                    the server answered {"error": {"code", "message"}}
    ├── BadRequestError         400: the HTTP parser could not read the request
    ├── InvalidRequestError     422: bad prompts, layers, ranges, job fields or checkpoint paths
    ├── UnauthorizedError       401: a write without the server's bearer token
    ├── JobsDisabledError       403: the server takes no jobs (no --checkpoint-root)
    ├── StoreReadOnlyError      403: the server's store is read-only (no registrations, no captures)
    ├── NotFoundError           404: unknown prompt, job or route
    │   └── ReportNotReadyError     report_not_ready: the job is queued or running
    ├── ConflictError           409: the resource's state refuses the request
    │   ├── PromptFailedError       prompt_failed: the target failed on the prompt
    │   ├── JobFailedError          job_failed: the job failed, it will never have a report
    │   └── LeaseLostError          lease_lost: the lease was taken over or the job ended
    ├── NotReadyError           503: still computing (retry_after_s says when to ask again)
    └── ServerError             5xx: a failure on the server (logged there)
"""

from __future__ import annotations

import httpx

from schemas.errors import ErrorCode


class CacheClientError(Exception):
    """Base of every error the client raises."""


class ServerUnreachable(CacheClientError):
    """No connection to the server (refused, DNS, timeout)."""


class ProtocolError(CacheClientError):
    """The server's response does not follow the API."""


class ApiError(CacheClientError):
    """The server reported an error as data: HTTP status, error code and message."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retry_after_s = retry_after_s


class BadRequestError(ApiError):
    """400: the request could not be parsed as HTTP (e.g. its request line is too long)."""


class InvalidRequestError(ApiError):
    """422: the request was invalid (prompts, layers, ranges, job fields, checkpoint paths)."""


class UnauthorizedError(ApiError):
    """401: the server wants `Authorization: Bearer <token>` on writes."""


class JobsDisabledError(ApiError):
    """403 jobs_disabled: the server was started without --checkpoint-root."""


class StoreReadOnlyError(ApiError):
    """403 store_read_only: the server's store is read-only; it serves what is stored and captures nothing."""


class NotFoundError(ApiError):
    """404: unknown prompt id, job id or route."""


class ReportNotReadyError(NotFoundError):
    """404 report_not_ready: the job has not finished yet."""


class ConflictError(ApiError):
    """409: the resource is in a state that refuses the request."""


class PromptFailedError(ConflictError):
    """409 prompt_failed: the target failed on this prompt."""


class JobFailedError(ConflictError):
    """409 job_failed: the job failed for good."""


class LeaseLostError(ConflictError):
    """409 lease_lost: this worker no longer holds the job; its result was not stored."""


class NotReadyError(ApiError):
    """503: the prompt is still being computed; ask again after `retry_after_s`."""


class ServerError(ApiError):
    """5xx: the server failed (the details are in its log)."""


_BY_CODE: dict[ErrorCode, type[ApiError]] = {
    ErrorCode.bad_http_request: BadRequestError,
    ErrorCode.invalid_request: InvalidRequestError,
    ErrorCode.invalid_prompt: InvalidRequestError,
    ErrorCode.invalid_layers: InvalidRequestError,
    ErrorCode.unknown_prompts: InvalidRequestError,
    ErrorCode.unknown_sets: InvalidRequestError,
    ErrorCode.invalid_checkpoint_path: InvalidRequestError,
    ErrorCode.storage_exceeded: InvalidRequestError,
    ErrorCode.unauthorized: UnauthorizedError,
    ErrorCode.jobs_disabled: JobsDisabledError,
    ErrorCode.store_read_only: StoreReadOnlyError,
    ErrorCode.not_found: NotFoundError,
    ErrorCode.prompt_not_found: NotFoundError,
    ErrorCode.job_not_found: NotFoundError,
    ErrorCode.report_not_ready: ReportNotReadyError,
    ErrorCode.method_not_allowed: ApiError,
    ErrorCode.prompt_failed: PromptFailedError,
    ErrorCode.job_failed: JobFailedError,
    ErrorCode.lease_lost: LeaseLostError,
    ErrorCode.prompt_not_ready: NotReadyError,
    ErrorCode.stored_data_corrupt: NotReadyError,
    ErrorCode.server_unhealthy: ServerError,
    ErrorCode.internal_error: ServerError,
    ErrorCode.http_error: ApiError,
}
# For a code this client does not know (a newer server): the class of its status.
_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: JobsDisabledError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidRequestError,
    503: NotReadyError,
}


def error_class(status: int, code: str) -> type[ApiError]:
    """The exception class for an error body: by code, else by status."""
    if code in ErrorCode.__members__:
        return _BY_CODE[ErrorCode(code)]
    if status >= 500 and status != 503:
        return ServerError
    return _BY_STATUS.get(status, ApiError)


def raise_for_error(response: httpx.Response) -> None:
    """Raise the typed error an unsuccessful response carries; return on success."""
    if response.is_success:
        return
    try:
        err = response.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        raise ProtocolError(f"HTTP {response.status_code} without an error body: {response.text[:200]!r}") from None
    retry = response.headers.get("Retry-After")
    retry_after_s = float(retry) if retry is not None and retry.isdigit() else None
    raise error_class(response.status_code, code)(response.status_code, code, message, retry_after_s)
