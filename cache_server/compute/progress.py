"""Progress lines in the server log while the target computes."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("cache_server.compute.scheduler")


class Progress:
    """Logs, at most every `every_s` while the target works, how many prompts it computed and how fast."""

    def __init__(self, every_s: float = 5.0) -> None:
        self._every_s = every_s
        self._since = self._last = time.monotonic()
        self._count = self._logged = 0

    def computed(self, n: int) -> None:
        """`n` more prompts computed."""
        now = time.monotonic()
        if self._count == self._logged and now - self._last > self._every_s:  # idle since the last line
            self._since = now
        self._count += n
        if now - self._last >= self._every_s or self._logged == 0:
            rate = (self._count - self._logged) / max(now - self._since, 1e-9)
            log.info("computed %d prompts, %.1f prompts/s", self._count, rate)
            self._last, self._since, self._logged = now, now, self._count
