"""What `/healthz` reports: the server's background loops, each alive and succeeding. A loop that died,
or one that has failed without a success for longer than a bound (the database away, say), makes the
server unhealthy until it succeeds again (vLLM's `/health` -> `check_health()` is the model)."""

from __future__ import annotations

import threading
import time


class Health:
    """Each loop reports `ok` after a successful round and `failing` after a failed one; `watch` adds
    its thread, which must stay alive until `stopping`."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._lock = threading.Lock()
        self._last_ok: dict[str, float] = {}
        self._failing: dict[str, tuple[float, str]] = {}  # loop -> (last success before, last error)
        self._threads: dict[str, threading.Thread] = {}
        self._stopping = threading.Event()

    def watch(self, loop: str, thread: threading.Thread) -> None:
        """Report `loop` dead once `thread` has started and ended before `stopping`."""
        with self._lock:
            self._threads[loop] = thread
            self._last_ok[loop] = time.monotonic()

    def stopping(self) -> None:
        """The server is shutting down: its loops end on purpose."""
        self._stopping.set()

    def ok(self, loop: str) -> None:
        """`loop` completed a round."""
        with self._lock:
            self._last_ok[loop] = time.monotonic()
            self._failing.pop(loop, None)

    def failing(self, loop: str, error: BaseException) -> None:
        """`loop` failed a round with `error`."""
        with self._lock:
            since = self._last_ok.get(loop, time.monotonic())
            self._failing[loop] = (since, f"{type(error).__name__}: {error}")

    def problems(self) -> list[str]:
        """Why the server is unhealthy; empty when it is healthy."""
        now = time.monotonic()
        found = []
        with self._lock:
            for loop, thread in self._threads.items():
                if thread.ident is not None and not thread.is_alive() and not self._stopping.is_set():
                    found.append(f"the {loop} loop has stopped")
            for loop, (since, error) in self._failing.items():
                if now - since > self.bound_s:
                    found.append(f"the {loop} loop has failed for {now - since:.0f} s: {error}")
        return found
