"""The one table from exceptions to `{"error": {"code", "message"}}` responses, and the OpenAPI
declaration of those responses per route. A status always comes from the code (`schemas.errors`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cache_server.errors import CacheServerError, PromptNotReady, StoredDataCorrupt, Unauthorized
from schemas.errors import ErrorBody, ErrorCode, ErrorDetail

log = logging.getLogger(__name__)

_BY_HTTP_STATUS = {400: ErrorCode.bad_http_request, 404: ErrorCode.not_found, 405: ErrorCode.method_not_allowed}


def error_body(code: ErrorCode, message: str) -> dict[str, Any]:
    """The JSON of an error body."""
    return ErrorBody(error=ErrorDetail(code=code, message=message)).model_dump()


def error_response(
    code: ErrorCode, message: str, headers: dict[str, str] | None = None, status: int | None = None
) -> JSONResponse:
    """An error response; its status is the code's unless the HTTP layer chose another."""
    return JSONResponse(error_body(code, message), status_code=status or code.status, headers=headers)


def error_responses(*codes: ErrorCode) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for a route that may answer with `codes`, plus 422 for bad input and 400 for a
    request the HTTP layer cannot read (a request line over the parser's limit, a body that is not JSON),
    which any route may get."""
    by_status: dict[int, list[str]] = {}
    for code in (*codes, ErrorCode.invalid_request, ErrorCode.bad_http_request):
        by_status.setdefault(code.status, []).append(code.value)
    return {
        status: {"model": ErrorBody, "description": "error codes: " + ", ".join(sorted(set(names)))}
        for status, names in sorted(by_status.items())
    }


async def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CacheServerError)
    headers = None
    if isinstance(exc, PromptNotReady | StoredDataCorrupt) and exc.retry_after_s is not None:
        headers = {"Retry-After": str(exc.retry_after_s)}
    elif isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    return error_response(exc.code, str(exc), headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return error_response(ErrorCode.invalid_request, "; ".join(parts) or "invalid request")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _BY_HTTP_STATUS.get(exc.status_code, ErrorCode.http_error)
    return error_response(code, str(exc.detail), status=exc.status_code)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(ErrorCode.internal_error, "internal server error (logged on the server)")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers: domain errors, validation errors, HTTP errors, and anything else (500)."""
    app.add_exception_handler(CacheServerError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
