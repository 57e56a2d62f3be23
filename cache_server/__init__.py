"""Run a target LLM once per prompt, keep every decoder layer's output in Zarr, serve any layer set.

What other packages may import: the HTTP clients and their errors. The server itself is started
with `cache-server serve` (`cache_server.app.create_app` for tests).
"""

from cache_server.client import (
    ApiError,
    CacheClient,
    CacheClientError,
    InvalidRequestError,
    NotFoundError,
    NotReadyError,
    PromptFailedError,
    ProtocolError,
    ServerUnreachable,
)
from cache_server.jobs_client import JobFailedError, JobsClient, LeaseLostError, ReportNotReadyError, UnauthorizedError

__all__ = [
    "ApiError",
    "CacheClient",
    "CacheClientError",
    "InvalidRequestError",
    "JobFailedError",
    "JobsClient",
    "LeaseLostError",
    "NotFoundError",
    "NotReadyError",
    "PromptFailedError",
    "ProtocolError",
    "ReportNotReadyError",
    "ServerUnreachable",
    "UnauthorizedError",
]
