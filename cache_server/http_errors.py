"""The one table that turns exceptions into `{"error": {"code", "message"}}` HTTP responses."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cache_server.errors import (
    CacheServerError,
    InvalidRequest,
    JobFailed,
    JobNotFound,
    JobRunning,
    JobsDisabled,
    LeaseLost,
    PromptFailed,
    PromptNotFound,
    PromptNotReady,
    ReportNotReady,
    Unauthorized,
)
from schemas.errors import ErrorBody, ErrorDetail

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[CacheServerError], int] = {
    InvalidRequest: 422,
    Unauthorized: 401,
    JobsDisabled: 403,
    PromptNotFound: 404,
    JobNotFound: 404,
    ReportNotReady: 404,
    PromptNotReady: 503,
    PromptFailed: 409,
    JobFailed: 409,
    JobRunning: 409,
    LeaseLost: 409,
}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _status_for(exc: CacheServerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return 500


async def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CacheServerError)
    headers = None
    if isinstance(exc, PromptNotReady):
        headers = {"Retry-After": str(exc.retry_after_s)}
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    return error_response(_status_for(exc), exc.code, str(exc), headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return error_response(422, "invalid_request", "; ".join(parts) or "invalid request")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error (logged on the server)")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CacheServerError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
