"""The scheduler: one compute thread owns the target and runs captures in batches up to a token
budget; a small writer pool publishes the results to the store.

Capture work lives in the coordination database (`CaptureQueue`), shared by every server on the store:
this server claims it under a lease (renewed while it computes), so each (prompt, missing layers)
is computed once across all servers, and a dead server's work is taken over when its lease expires.
`cache_server_prompts_computed_total` counts this server's runs. Waiters on this server are woken
when it finishes a prompt (`finished`); work finished elsewhere is seen by polling the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from cache_server.capture.target import Captured, Target
from cache_server.compute.metrics import Metrics
from cache_server.compute.registry import Registration, Registry
from cache_server.coordination.captures import CaptureQueue
from cache_server.errors import PromptFailed
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest

log = logging.getLogger(__name__)


@dataclass
class ComputeTask:
    """One claimed prompt to run through the target, for `layers`."""

    reg: Registration
    layers: set[int]

    @property
    def token_estimate(self) -> int:
        """Tokens this task adds to a batch (prompt plus given or generated response)."""
        reg = self.reg
        return reg.prompt_len + (len(reg.response_ids) if reg.response_ids else reg.max_new_tokens or 0)


class Scheduler:
    """Claims capture work, batches it on one thread, and publishes each result once."""

    def __init__(
        self,
        target: Target,
        store: HiddenStore,
        metrics: Metrics,
        captures: CaptureQueue,
        registry: Registry,
        *,
        capture_layers: Sequence[int],
        batch_tokens: int,
        poll_s: float = 0.2,
    ) -> None:
        self.target = target
        self.store = store
        self.metrics = metrics
        self.captures = captures
        self.registry = registry
        self.capture_layers = sorted(capture_layers)
        self._batch_tokens = batch_tokens
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._held: set[str] = set()  # claimed by this server, not yet finished
        self._finished: dict[str, Future[None]] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._writers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store-writer")
        self._thread = threading.Thread(target=self._compute_loop, name="target-compute", daemon=True)
        self._renewer = threading.Thread(target=self._renew_loop, name="capture-leases", daemon=True)
        self._progress = _Progress()

    def start(self) -> None:
        """Start computing and renewing leases."""
        self._thread.start()
        self._renewer.start()

    def close(self) -> None:
        """Finish the batch in hand, publish it and stop; work not started goes back to the queue."""
        self._stopping.set()
        self._wake.set()
        for thread in (self._thread, self._renewer):
            if thread.is_alive():
                thread.join()
        self._writers.shutdown(wait=True)
        with self._lock:
            held = list(self._held)
        self.captures.release(held)

    # -- requests and failures ------------------------------------------------------------------

    def request_many(
        self,
        regs: Sequence[Registration],
        layers: Sequence[int],
        *,
        retry_failed: bool = False,
        known: Mapping[str, PromptManifest | None] = MappingProxyType({}),
    ) -> None:
        """Make sure some server will compute the `layers` of each of `regs` that are not stored (for a
        new prompt, the capture layers too), in one transaction; PromptFailed if the target failed on
        one. `retry_failed` (a registration) queues failed ones again; `known`: manifests the caller
        just read (None: nothing stored), not read again."""
        wanted: dict[str, set[int]] = {}
        for reg in regs:
            pid = reg.prompt_id
            manifest = known[pid] if pid in known else self.store.manifest(pid, fresh=True)
            missing = set(layers) - set(manifest.layers) if manifest is not None else {*layers, *self.capture_layers}
            if missing:
                wanted[reg.prompt_id] = missing
        if not wanted:
            return
        states = self.captures.request_many(wanted, retry_failed=retry_failed)
        self._wake.set()
        for prompt_id, state in states.items():
            if state.status == "failed":
                raise PromptFailed(f"prompt {prompt_id} failed: {state.error}")

    def finished(self, prompt_id: str) -> Future[None]:
        """Resolves when this server next finishes `prompt_id` (published or failed)."""
        with self._lock:
            return self._finished.setdefault(prompt_id, Future())

    def failure(self, prompt_id: str) -> str | None:
        """Why the target failed on this prompt, or None."""
        state = self.captures.state(prompt_id)
        return state.error if state is not None and state.status == "failed" else None

    def failed_ids(self) -> set[str]:
        """Every prompt the target failed on (until registered again)."""
        return {p for p, state in self.captures.states().items() if state.status == "failed"}

    # -- compute thread -------------------------------------------------------------------------

    def _compute_loop(self) -> None:
        while not self._stopping.is_set():
            batch = self._claim_batch()
            if batch:
                self._run_batch(batch)
            else:
                self._wake.wait(self._poll_s)  # new work here, or some on another server's store
                self._wake.clear()

    def _claim_batch(self) -> list[ComputeTask]:
        """Claimed work up to the token budget; what another server already published is closed."""
        batch: list[ComputeTask] = []
        tokens = 0
        while tokens < self._batch_tokens and not self._stopping.is_set():
            claimed = self.captures.claim()
            if claimed is None:
                break
            pid = claimed.prompt_id
            with self._lock:
                self._held.add(pid)
            try:
                reg = self.registry.get(pid)
                if reg is None:
                    raise LookupError(f"prompt {pid} has capture work but no registration")
                manifest = self.store.manifest(pid, fresh=True)
            except Exception as e:
                self._fail(pid, e)
                continue
            wanted = set(claimed.layers) - set(manifest.layers if manifest is not None else ())
            if manifest is not None and not wanted:  # published by a server that died before saying so
                self._finish(pid)
                continue
            batch.append(ComputeTask(reg, wanted))
            tokens += batch[-1].token_estimate
        return batch

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
                self._fail(task.reg.prompt_id, e)
            return
        self.metrics.prompts_computed.inc(len(ready))
        self._progress.computed(len(ready))
        for (task, seq), out in zip(ready, outputs, strict=True):
            self._writers.submit(self._publish, task, seq, out)

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.captures.lease_s / 3):
            with self._lock:
                held = list(self._held)
            try:
                self.captures.renew(held)
            except Exception as e:  # the database is away: keep trying; the leases may expire meanwhile
                log.warning("could not renew capture leases: %s", e)

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
                self._fail(reg.prompt_id, e)
        for max_new, indices in to_generate.items():
            prompts = [batch[i].reg.prompt_ids for i in indices]
            try:
                responses = self.target.generate(prompts, max_new)
            except Exception as e:
                for i in indices:
                    self._fail(batch[i].reg.prompt_id, e)
                continue
            for i, prompt, response in zip(indices, prompts, responses, strict=True):
                known[i] = list(prompt) + response
        return [(batch[i], known[i]) for i in sorted(known)]

    def _publish(self, task: ComputeTask, seq: list[int], out: Captured) -> None:
        layers = {k: out.states[k] for k in task.layers}
        try:
            self.store.write(
                task.reg.prompt_id,
                np.asarray(seq, dtype=np.int64),
                task.reg.prompt_len,
                layers,
                greedy_mismatches=out.greedy_mismatches,
            )
        except Exception as e:
            self._fail(task.reg.prompt_id, e)
            return
        self._finish(task.reg.prompt_id)

    def _finish(self, prompt_id: str) -> None:
        if not self.captures.done(prompt_id):
            log.warning("prompt %s: published, but its capture lease had passed to another server", prompt_id)
        self._release(prompt_id)

    def _fail(self, prompt_id: str, error: Exception) -> None:
        log.error("prompt %s failed: %s", prompt_id, error, exc_info=error)
        self.metrics.prompts_failed.inc()
        self.captures.fail(prompt_id, f"{type(error).__name__}: {error}")
        self._release(prompt_id)

    def _release(self, prompt_id: str) -> None:
        """No longer held here; wake this server's waiters."""
        with self._lock:
            self._held.discard(prompt_id)
            waiters = self._finished.pop(prompt_id, None)
        if waiters is not None:
            waiters.set_result(None)


class _Progress:
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
