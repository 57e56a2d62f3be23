"""Waiting for prompts to be ready: a few polled one by one, many through the paged listing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from cache_server.client.errors import NotFoundError, PromptFailedError
from schemas.errors import ErrorCode
from schemas.prompts import PromptState, PromptStatus

POLL_ONE_BY_ONE = 32  # above this many pending prompts, the paged listing is read instead


class PromptStates(Protocol):
    """What waiting reads: one prompt's state, or every prompt's (`CacheClient` is one)."""

    def prompt(self, prompt_id: str) -> PromptState:
        """One prompt's state."""
        ...

    def prompts(self) -> Sequence[PromptState]:
        """Every registered prompt's state, without token ids."""
        ...


def wait_ready(
    client: PromptStates,
    prompt_ids: Sequence[str],
    *,
    timeout_s: float,
    poll_s: float,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Poll until every prompt is ready; PromptFailedError on a failure, TimeoutError past the bound."""
    deadline = time.monotonic() + timeout_s
    pending = set(prompt_ids)
    total = len(pending)
    while pending:
        if len(pending) <= POLL_ONE_BY_ONE:
            states = [client.prompt(pid) for pid in pending]
        else:
            states = [s for s in client.prompts() if s.prompt_id in pending]
            unknown = pending - {s.prompt_id for s in states}
            if unknown:
                raise NotFoundError(404, ErrorCode.prompt_not_found, f"prompts not registered: {sorted(unknown)[:5]}")
        for state in states:
            if state.status == PromptStatus.failed:
                raise PromptFailedError(409, ErrorCode.prompt_failed, f"prompt {state.prompt_id} failed: {state.error}")
            if state.status == PromptStatus.ready:
                pending.discard(state.prompt_id)
        if progress is not None:
            progress(total - len(pending), total)
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} prompts not ready after {timeout_s:.0f} s: {sorted(pending)[:5]}")
            time.sleep(poll_s)
