"""Errors the cache server raises for callers; `http_errors.py` maps each to one HTTP status.

CacheServerError
├── InvalidRequest          bad input the caller can fix (422)
│   ├── InvalidPrompt       a prompt that cannot be tokenized, is too long or has bad ids
│   └── InvalidLayers       a layer list or token range outside the target
├── PromptNotFound          no prompt with that id is registered (404)
├── PromptNotReady          still computing after the bounded wait (503 + Retry-After)
└── PromptFailed            the target failed on this prompt (409)
"""

from __future__ import annotations


class CacheServerError(Exception):
    """Base of every error the server reports as data."""

    code = "error"


class InvalidRequest(CacheServerError):
    """Bad input the caller can fix."""

    code = "invalid_request"


class InvalidPrompt(InvalidRequest):
    """A prompt that cannot be tokenized, is too long, or has ids outside the vocabulary."""

    code = "invalid_prompt"


class InvalidLayers(InvalidRequest):
    """A layer list or token range outside what the target has."""

    code = "invalid_layers"


class PromptNotFound(CacheServerError):
    """No prompt with that id is registered for this target."""

    code = "prompt_not_found"


class PromptNotReady(CacheServerError):
    """The prompt is still being computed after the bounded wait."""

    code = "prompt_not_ready"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PromptFailed(CacheServerError):
    """The target failed to compute this prompt; the error says why."""

    code = "prompt_failed"
