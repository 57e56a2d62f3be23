"""Progress lines in the server log while the target works: prompts captured, responses generated."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("cache_server.compute.scheduler")


class Progress:
    """Logs, at most every `every_s`, how many prompts (`noun`) were `verb` (computed, generated) and how
    fast: over the time spent on the ones done since the last line, each batch from when it `began`, so
    that an idle spell between batches (a set registered minutes after the last) is not counted and one
    that overlaps the batch before (concurrent requests to an engine) is counted once."""

    def __init__(
        self, verb: str, noun: str, *, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._verb, self._noun, self._every_s, self._clock = verb, noun, every_s, clock
        self._total = 0
        self._count = self._tokens = 0  # since the last line
        self._busy_s = 0.0
        self._until = float("-inf")  # when the last batch counted ended
        self._last_line: float | None = None

    def done(self, n: int, tokens: int, began: float) -> None:
        """`n` more prompts of `tokens` tokens in all, worked on from `began` (this clock's time) until now."""
        now = self._clock()
        self._busy_s += max(0.0, now - max(began, self._until))
        self._until = max(self._until, now)
        self._total += n
        self._count, self._tokens = self._count + n, self._tokens + tokens
        if self._last_line is not None and now - self._last_line < self._every_s:
            return
        rates = (
            f" in {self._busy_s:.1f} s, {self._count / self._busy_s:.1f} {self._noun}/s, "
            f"{self._tokens / self._busy_s:.0f} tokens/s"
            if self._busy_s > 0
            else ""  # a clock that did not move: no rate rather than a division by ~0
        )
        log.info(
            "%s %d %s (%d tokens)%s; %d in all", self._verb, self._count, self._noun, self._tokens, rates, self._total
        )
        self._last_line, self._count, self._tokens, self._busy_s = now, 0, 0, 0.0
