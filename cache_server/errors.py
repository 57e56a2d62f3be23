"""Errors the cache server raises for callers. Each carries one `ErrorCode`, and with it its HTTP
status (`schemas/errors.py`); `api/error_handlers.py` turns them into error bodies.

CacheServerError
├── InvalidRequest          bad input the caller can fix (422)
│   ├── InvalidPrompt       a prompt that cannot be tokenized, is too long or has bad ids
│   ├── InvalidLayers       a layer list or token range outside the target
│   ├── UnknownPrompts      a job names prompt ids that are not registered
│   ├── UnknownSets         a request names prompt sets that do not exist
│   ├── InvalidCheckpointPath  a job's checkpoint is outside the root, missing or not a checkpoint
│   └── StorageExceeded     a registration would take a local store past its free space, or a
│                           capture's write found the store full
├── Unauthorized            a write without the server's bearer token (401)
├── JobsDisabled            job submission without --checkpoint-root (403)
├── StoreReadOnly           a registration or capture on a server whose store is read-only (403)
├── PromptNotFound          no prompt with that id is registered (404)
├── JobNotFound             no job with that id (404)
├── ReportNotReady          the job has no report yet (404)
├── PromptNotReady          still computing after the bounded wait (503 + Retry-After)
├── StoredDataCorrupt       stored bytes that do not decode; bad layers are captured again (503)
├── ServerUnhealthy         a background loop is dead or has failed too long (503, GET /healthz)
├── PromptFailed            the target failed on this prompt (409)
├── JobFailed               the job failed, so it will never have a report (409)
└── LeaseLost               a worker quoted a lease the job no longer holds (409)

A failed capture is recorded as text in the capture table (`failure_text`), which every server
reads back as its error (`capture_failed`): a full or read-only store keeps its own code there.
"""

from __future__ import annotations

import errno
import os

from schemas.errors import ErrorCode


class CacheServerError(Exception):
    """Base of every error the server reports as data."""

    code: ErrorCode = ErrorCode.internal_error


class InvalidRequest(CacheServerError):
    """Bad input the caller can fix."""

    code = ErrorCode.invalid_request


class InvalidPrompt(InvalidRequest):
    """A prompt that cannot be tokenized, is too long, or has ids outside the vocabulary."""

    code = ErrorCode.invalid_prompt


class InvalidLayers(InvalidRequest):
    """A layer list or token range outside what the target has."""

    code = ErrorCode.invalid_layers


class StorageExceeded(InvalidRequest):
    """Registering these prompts would take a local store past its free space (the numbers say how far),
    or a capture's write found the store full (nothing of it is left: free space, register it again)."""

    code = ErrorCode.storage_exceeded


class PromptNotFound(CacheServerError):
    """No prompt with that id is registered for this target."""

    code = ErrorCode.prompt_not_found


class PromptNotReady(CacheServerError):
    """The prompt is still being computed after the bounded wait."""

    code = ErrorCode.prompt_not_ready

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoredDataCorrupt(CacheServerError):
    """Stored bytes of a published prompt do not decode. Bad layers are no longer served and are being
    captured again (`retry_after_s`); bad token ids cannot be (None: register the prompt again)."""

    code = ErrorCode.stored_data_corrupt

    def __init__(self, message: str, retry_after_s: int | None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerUnhealthy(CacheServerError):
    """A background loop of the server is dead, or has failed for longer than its bound."""

    code = ErrorCode.server_unhealthy


class PromptFailed(CacheServerError):
    """The target failed to compute this prompt; the error says why."""

    code = ErrorCode.prompt_failed


class UnknownPrompts(InvalidRequest):
    """A job names prompt ids that are not registered for the target."""

    code = ErrorCode.unknown_prompts


class UnknownSets(InvalidRequest):
    """A request names prompt sets that no registration created."""

    code = ErrorCode.unknown_sets


class InvalidCheckpointPath(InvalidRequest):
    """A job's checkpoint resolves outside the checkpoint root, does not exist or is not a checkpoint."""

    code = ErrorCode.invalid_checkpoint_path


class Unauthorized(CacheServerError):
    """A write request without the bearer token the server was started with."""

    code = ErrorCode.unauthorized


class JobsDisabled(CacheServerError):
    """Jobs cannot be submitted because the server has no checkpoint root."""

    code = ErrorCode.jobs_disabled


class StoreReadOnly(CacheServerError):
    """The server's store is read-only: it serves the prompts stored, and registers and captures none."""

    code = ErrorCode.store_read_only


class JobNotFound(CacheServerError):
    """No job with that id."""

    code = ErrorCode.job_not_found


class ReportNotReady(CacheServerError):
    """The job is queued or running; its report does not exist yet."""

    code = ErrorCode.report_not_ready


class JobFailed(CacheServerError):
    """The job failed for good; the message carries its last error."""

    code = ErrorCode.job_failed


class LeaseLost(CacheServerError):
    """The lease a worker quoted is no longer the job's: it expired and was claimed again, or ended."""

    code = ErrorCode.lease_lost


# -- failed captures: recorded as text in the capture table, read back by every server ----------------

_NO_ROOM = {errno.ENOSPC, errno.EDQUOT}
_NO_WRITES = {errno.EROFS, errno.EACCES, errno.EPERM}
_CAPTURE_CODES: dict[str, type[CacheServerError]] = {c.code.value: c for c in (StorageExceeded, StoreReadOnly)}


def store_write_error(error: Exception) -> Exception:
    """A store write's error as the server reports it: StorageExceeded for a full file system or quota,
    StoreReadOnly for one that refuses writes; any other error as it is. Named by its `strerror`
    alone: which file it was is the server's business (its log has it)."""
    number = error.errno if isinstance(error, OSError) and error.errno is not None else -1
    if number in _NO_ROOM:
        why = f"the store ran out of space writing it ({os.strerror(number)})"
        found: CacheServerError = StorageExceeded(f"{why}; not retried by itself: free space, then register it again")
    elif number in _NO_WRITES:
        found = StoreReadOnly(f"the store refused the write ({os.strerror(number)})")
    else:
        return error
    found.__cause__ = error  # logged with it: which write failed, and where
    return found


def failure_text(error: Exception) -> str:
    """What the capture table records of a failure: `<code>: message` for the errors that keep their code
    (`capture_failed` reads it back), else `<exception type>: message`."""
    if isinstance(error, CacheServerError) and error.code.value in _CAPTURE_CODES:
        return f"{error.code.value}: {error}"
    return f"{type(error).__name__}: {error}"


def capture_failed(prompt_id: str, recorded: str | None) -> CacheServerError:
    """The error a request for a prompt whose capture failed gets: the recorded code's (a full or
    read-only store), else PromptFailed."""
    cls = _CAPTURE_CODES.get((recorded or "").partition(":")[0], PromptFailed)
    return cls(f"prompt {prompt_id} failed: {recorded}")
