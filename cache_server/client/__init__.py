"""The light client of the cache server: httpx, numpy, ml_dtypes and pydantic, never torch.

    from cache_server.client import CacheClient, JobsClient, LeaseLostError

`CacheClient` (`cache.py`) for prompts, the target and tensors, `JobsClient` (`jobs.py`) for jobs and
the worker protocol, waiting for prompts to be ready (`waiting.py`); large bodies read into one buffer
(`body_reader.py`), pieces decoded on the client's
cores (`pieces.py`); results are numpy arrays with `.to_torch()` (`results.py`); errors are the tree
in `errors.py`. Its torch side, imported only by name: training samples in the peers' schemas
(`torch_dataset.py`), and speculators' map-style training dataset over the cache (`speculators_dataset.py`).
"""

from cache_server.client.cache import CacheClient
from cache_server.client.errors import (
    ApiError,
    BadRequestError,
    CacheClientError,
    ConflictError,
    InvalidRequestError,
    JobFailedError,
    JobsDisabledError,
    LeaseLostError,
    NotFoundError,
    NotReadyError,
    PromptFailedError,
    ProtocolError,
    ReportNotReadyError,
    ServerError,
    ServerUnreachable,
    StoreReadOnlyError,
    UnauthorizedError,
)
from cache_server.client.jobs import JobsClient
from cache_server.client.pieces import OutMismatch
from cache_server.client.results import HiddenResult, TargetHeads

__all__ = [
    "ApiError",
    "BadRequestError",
    "CacheClient",
    "CacheClientError",
    "ConflictError",
    "HiddenResult",
    "InvalidRequestError",
    "JobFailedError",
    "JobsClient",
    "JobsDisabledError",
    "LeaseLostError",
    "NotFoundError",
    "NotReadyError",
    "OutMismatch",
    "PromptFailedError",
    "ProtocolError",
    "ReportNotReadyError",
    "ServerError",
    "ServerUnreachable",
    "StoreReadOnlyError",
    "TargetHeads",
    "UnauthorizedError",
]
