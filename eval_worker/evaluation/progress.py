"""How far an evaluation has walked its prompts: per checkpoint, the prompts walked of its total and
the drafter rounds so far, with an ETA at the rate so far. The evaluator counts into a `WalkProgress`
after every drafter forward and every chunk of prompts walked; the local bar, a job's lease renewals
and the worker's log read it. `stop(run)` ends that checkpoint's walk at its next drafter forward
(`WalkStopped`): how a cancelled job stops promptly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eval_worker.errors import WalkStopped


@dataclass(frozen=True)
class WalkSoFar:
    """One checkpoint's walk so far."""

    prompts_walked: int
    prompts_total: int
    rounds: int  # drafter rounds (blocks drafted), all walks together
    elapsed_s: float
    eta_s: float | None  # None until a prompt is walked

    def line(self) -> str:
        """`walked 4/14 prompts, 1234 rounds, 52 s, ETA 130 s`."""
        eta = f"ETA {self.eta_s:.0f} s" if self.eta_s is not None else "ETA unknown"
        return (
            f"walked {self.prompts_walked}/{self.prompts_total} prompts, {self.rounds} rounds, "
            f"{self.elapsed_s:.0f} s, {eta}"
        )


class WalkProgress:
    """Counters of every checkpoint of one evaluation (`start` says how many and their prompt counts),
    read from other threads while the walk runs; `clock` (seconds) is injectable."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._totals: list[int] = []
        self._walked: list[int] = []
        self._rounds: list[int] = []
        self._stopped: set[int] = set()
        self._started = 0.0
        self.listeners: list[Callable[[], None]] = []  # told after each count (the local bar)

    def start(self, totals: Sequence[int]) -> None:
        """The walk begins: checkpoint i has `totals[i]` prompts to walk."""
        with self._lock:
            self._totals, self._walked, self._rounds = list(totals), [0] * len(totals), [0] * len(totals)
            self._started = self._clock()

    @property
    def started(self) -> bool:
        """Whether the walk has begun (`start`)."""
        return bool(self._totals)

    def drafted(self, run: int, blocks: int) -> None:
        """Checkpoint `run` drafted `blocks` more rounds; WalkStopped once it was stopped."""
        with self._lock:
            self._rounds[run] += blocks
        if run in self._stopped:
            raise WalkStopped(f"the walk of checkpoint {run} was stopped")
        self._tell()

    def walked(self, run: int, prompts: int) -> None:
        """Checkpoint `run` finished walking `prompts` more prompts."""
        with self._lock:
            self._walked[run] += prompts
        self._tell()

    def stop(self, run: int) -> None:
        """End checkpoint `run`'s walk at its next drafter forward."""
        self._stopped.add(run)

    def stopping(self, run: int) -> bool:
        """Whether checkpoint `run`'s walk was told to stop."""
        return run in self._stopped

    def of(self, run: int) -> WalkSoFar:
        """Checkpoint `run`'s walk so far."""
        with self._lock:
            walked, total, rounds = self._walked[run], self._totals[run], self._rounds[run]
        return _walked(walked, total, rounds, self._clock() - self._started)

    def overall(self) -> WalkSoFar:
        """Every checkpoint's walks together (a sweep's bar)."""
        with self._lock:
            walked, total, rounds = sum(self._walked), sum(self._totals), sum(self._rounds)
        return _walked(walked, total, rounds, self._clock() - self._started)

    def _tell(self) -> None:
        for listener in self.listeners:
            listener()


def _walked(walked: int, total: int, rounds: int, elapsed: float) -> WalkSoFar:
    eta = elapsed * (total - walked) / walked if walked else None
    return WalkSoFar(walked, total, rounds, elapsed, eta)
