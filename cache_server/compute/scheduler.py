"""The single-flight scheduler: one compute thread owns the target and runs queued prompts in
batches up to a token budget; a small writer pool publishes the results to the store.

Every (prompt, missing layers) computation is single-flight: concurrent requests for it share one
future, and `cache_server_prompts_computed_total` counts each run. Failures are kept per prompt.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from cache_server.capture.target import Captured, Target
from cache_server.compute.metrics import Metrics
from cache_server.compute.registry import Registration
from cache_server.errors import PromptFailed
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest

log = logging.getLogger(__name__)


@dataclass
class ComputeTask:
    """One prompt to run through the target, for `layers`; its future resolves to the new manifest."""

    reg: Registration
    layers: set[int]
    future: Future[PromptManifest] = field(default_factory=Future)

    @property
    def token_estimate(self) -> int:
        """Tokens this task adds to a batch (prompt plus given or generated response)."""
        reg = self.reg
        return reg.prompt_len + (len(reg.response_ids) if reg.response_ids else reg.max_new_tokens or 0)


class Scheduler:
    """Queues compute tasks, batches them on one thread, and publishes each result once."""

    def __init__(
        self,
        target: Target,
        store: HiddenStore,
        metrics: Metrics,
        *,
        capture_layers: Sequence[int],
        batch_tokens: int,
    ) -> None:
        self.target = target
        self.store = store
        self.metrics = metrics
        self.capture_layers = sorted(capture_layers)
        self._batch_tokens = batch_tokens
        self._lock = threading.Lock()
        self._inflight: dict[str, ComputeTask] = {}
        self._failed: dict[str, str] = {}
        self._queue: queue.Queue[ComputeTask | None] = queue.Queue()
        self._writers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store-writer")
        self._thread = threading.Thread(target=self._compute_loop, name="target-compute", daemon=True)
        self._stopping = threading.Event()
        self._progress = _Progress()

    def start(self) -> None:
        """Start the compute thread."""
        self._thread.start()

    def close(self) -> None:
        """Finish the batch in hand and stop; queued tasks are dropped (their prompts stay registered)."""
        self._stopping.set()
        self._queue.put(None)  # wakes the compute thread if it waits for work
        if self._thread.is_alive():
            self._thread.join()
        self._writers.shutdown(wait=True)

    # -- failures -------------------------------------------------------------------------------

    def failure(self, prompt_id: str) -> str | None:
        """Why the target failed on this prompt, or None."""
        with self._lock:
            return self._failed.get(prompt_id)

    def failed_ids(self) -> set[str]:
        """Every prompt the target failed on since the server started."""
        with self._lock:
            return set(self._failed)

    def forget_failure(self, prompt_id: str) -> bool:
        """Clear a failure so that the prompt can be retried; True if there was one."""
        with self._lock:
            return self._failed.pop(prompt_id, None) is not None

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self, reg: Registration, layers: Sequence[int]) -> ComputeTask:
        """The in-flight task that will provide `layers`, queuing a new one only if none will."""
        prompt_id = reg.prompt_id
        with self._lock:
            if prompt_id in self._failed:
                raise PromptFailed(f"prompt {prompt_id} failed: {self._failed[prompt_id]}")
            task = self._inflight.get(prompt_id)
            if task is not None:
                return task  # the caller re-checks the layers once it is done
            manifest = self.store.manifest(prompt_id)
            # A new prompt stores the capture set too; a stored one only adds what it lacks.
            stored = set(manifest.layers) if manifest is not None else set()
            wanted = set(layers) - stored if manifest is not None else set(layers) | set(self.capture_layers)
            task = ComputeTask(reg=reg, layers=wanted)
            if manifest is not None and not wanted:
                task.future.set_result(manifest)
                return task
            self._inflight[prompt_id] = task
        self._queue.put(task)
        return task

    # -- compute thread -------------------------------------------------------------------------

    def _compute_loop(self) -> None:
        while True:
            task = self._queue.get()
            if task is None or self._stopping.is_set():
                return
            batch, tokens = [task], task.token_estimate
            while tokens < self._batch_tokens:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
                tokens += nxt.token_estimate
            self._run_batch(batch)

    def _run_batch(self, batch: list[ComputeTask]) -> None:
        ready = self._sequences(batch)
        if not ready:
            return
        layers = sorted(set().union(*(task.layers for task, _ in ready)))
        try:
            with self.metrics.compute_seconds.time():
                outputs = self.target.capture([seq for _, seq in ready], [t.reg.prompt_len for t, _ in ready], layers)
        except Exception as e:
            for task, _ in ready:
                self._fail(task, e)
            return
        self.metrics.prompts_computed.inc(len(ready))
        self._progress.computed(len(ready), waiting=self._queue.qsize())
        for (task, seq), out in zip(ready, outputs, strict=True):
            self._writers.submit(self._publish, task, seq, out)

    def _sequences(self, batch: list[ComputeTask]) -> list[tuple[ComputeTask, list[int]]]:
        """Prompt + response tokens of each task: already stored, given, or the target's greedy
        response. Responses are generated in one batch per max_new_tokens value; a task whose
        tokens cannot be had fails alone, and the rest of the batch goes on."""
        known: dict[int, list[int]] = {}
        to_generate: dict[int, list[int]] = {}  # max_new_tokens -> indices into batch
        for i, task in enumerate(batch):
            reg = task.reg
            try:
                if self.store.manifest(reg.prompt_id) is not None:
                    known[i] = [int(t) for t in self.store.token_ids(reg.prompt_id)]
                elif reg.response_ids is not None or reg.max_new_tokens is None:
                    known[i] = list(reg.prompt_ids) + list(reg.response_ids or ())
                else:
                    to_generate.setdefault(reg.max_new_tokens, []).append(i)
            except Exception as e:
                self._fail(task, e)
        for max_new, indices in to_generate.items():
            prompts = [batch[i].reg.prompt_ids for i in indices]
            try:
                responses = self.target.generate(prompts, max_new)
            except Exception as e:
                for i in indices:
                    self._fail(batch[i], e)
                continue
            for i, prompt, response in zip(indices, prompts, responses, strict=True):
                known[i] = list(prompt) + response
        return [(batch[i], known[i]) for i in sorted(known)]

    def _publish(self, task: ComputeTask, seq: list[int], out: Captured) -> None:
        layers = {k: out.states[k] for k in task.layers}
        try:
            manifest = self.store.write(
                task.reg.prompt_id,
                np.asarray(seq, dtype=np.int64),
                task.reg.prompt_len,
                layers,
                greedy_mismatches=out.greedy_mismatches,
            )
        except Exception as e:
            self._fail(task, e)
            return
        with self._lock:
            self._inflight.pop(task.reg.prompt_id, None)
        task.future.set_result(manifest)

    def _fail(self, task: ComputeTask, error: Exception) -> None:
        pid = task.reg.prompt_id
        log.error("prompt %s failed: %s", pid, error, exc_info=error)
        self.metrics.prompts_failed.inc()
        message = f"{type(error).__name__}: {error}"
        with self._lock:
            self._inflight.pop(pid, None)
            self._failed[pid] = message
        task.future.set_exception(PromptFailed(f"prompt {pid} failed: {message}"))


class _Progress:
    """Logs, at most every `every_s` while the target works, how many prompts it computed and how fast."""

    def __init__(self, every_s: float = 5.0) -> None:
        self._every_s = every_s
        self._since = self._last = time.monotonic()
        self._count = self._logged = 0

    def computed(self, n: int, *, waiting: int) -> None:
        """`n` more prompts computed; `waiting` tasks are queued behind them."""
        now = time.monotonic()
        if self._count == self._logged and now - self._last > self._every_s:  # idle since the last line
            self._since = now
        self._count += n
        if now - self._last >= self._every_s or waiting == 0:
            rate = (self._count - self._logged) / max(now - self._since, 1e-9)
            log.info("computed %d prompts (%d queued), %.1f prompts/s", self._count, waiting, rate)
            self._last, self._since, self._logged = now, now, self._count
