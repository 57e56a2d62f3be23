"""The scheduler: one compute thread owns the target and runs captures in batches up to a token
budget, fed by the target's own generation or a serving engine's; a writer pool publishes them.

Capture work lives in the coordination database (`CaptureQueue`), shared by every server on the store:
this server claims it under a lease (renewed while it computes), so each (prompt, missing layers) is
computed once across all servers, and a dead server's work is taken over when its lease expires.
Waiters are woken when a capture finishes (`finished`): on this server, or on another one through the
database's notices (Postgres); without them, work finished elsewhere is seen by polling."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType

import numpy as np

from cache_server.capture.target import Captured, Target
from cache_server.compute.health import Health
from cache_server.compute.metrics import Metrics
from cache_server.compute.progress import Progress
from cache_server.compute.registry import Registration, Registry
from cache_server.compute.responses import ComputeTask, Responses
from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.notices import Notice
from cache_server.errors import StoreReadOnly, capture_failed, failure_text, store_write_error
from cache_server.generation.engine import EngineClient
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from cache_server.store.read_only import is_read_only

log = logging.getLogger(__name__)

_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.5, 10.0  # between failed rounds of the compute loop


class Scheduler:
    """Claims capture work, has its responses generated, captures them in batches on one thread, and
    publishes each result once.

    Prompts flow claim -> response -> capture. A response is already stored (a recompute for more
    layers), given with the prompt, or generated: by the target itself on the compute thread,
    `generate_batch` sequences per `generate` call (a generation error fails that call's prompts), or
    by a serving engine (`engine`), up to `generator_concurrency` requests in flight while the target
    captures the prompts already answered. A capture error fails its whole batch, a store write's its prompt."""

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
        generate_batch: int = 16,
        engine: EngineClient | None = None,
        generator_concurrency: int = 64,
        health: Health | None = None,
    ) -> None:
        self.target, self.store, self.metrics = target, store, metrics
        self.captures, self.registry = captures, registry
        self.health = health if health is not None else Health(bound_s=30.0)
        self.capture_layers = sorted(capture_layers)
        self._batch_tokens = batch_tokens
        # With notices from every server, polling is only a safety net; SQLite's reach this process only.
        self.poll_s = 2.0 if captures.db.notices.crosses_processes else 0.2
        self._lock = threading.Lock()
        self._held: set[str] = set()  # claimed by this server, not yet finished
        self._finished: dict[str, Future[None]] = {}
        self._wake, self._stopping = threading.Event(), threading.Event()
        self.responses = Responses(
            target,
            store,
            generate_batch=generate_batch,
            engine=engine,
            concurrency=generator_concurrency,
            fail=self._fail,
            wake=self._wake.set,
            on_engine_error=metrics.generator_errors.inc,
        )
        self._writers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store-writer")
        self._thread = threading.Thread(target=self._compute_loop, name="target-compute", daemon=True)
        self._renewer = threading.Thread(target=self._renew_loop, name="capture-leases", daemon=True)
        self._progress = Progress()

    def start(self) -> None:
        """Start computing and renewing leases."""
        self.health.watch("compute", self._thread)
        self.health.watch("capture-lease", self._renewer)
        listener = self.captures.db.notices.listen(
            self._on_notice,
            ok=lambda: self.health.ok("notice-listener"),
            failing=lambda e: self.health.failing("notice-listener", e),
        )
        if listener is not None:
            self.health.watch("notice-listener", listener)
        self._thread.start()
        self._renewer.start()

    def close(self) -> None:
        """Publish the batch in hand and stop; work not started (generations in flight too) goes back to the queue."""
        self._stopping.set()
        self.health.stopping()
        self._wake.set()
        self.responses.close()
        for thread in (self._thread, self._renewer):
            if thread.is_alive():
                thread.join()
        self._writers.shutdown(wait=True)
        with self._lock:
            held = list(self._held)
        self.captures.release(held)

    # -- requests -------------------------------------------------------------------------------

    def request_many(
        self,
        regs: Sequence[Registration],
        layers: Sequence[int],
        *,
        retry_failed: bool = False,
        known: Mapping[str, PromptManifest | None] = MappingProxyType({}),
    ) -> None:
        """Make sure some server will compute the `layers` of each of `regs` that are not stored (for a
        new prompt, the capture layers too), in one transaction; StoreReadOnly if this server may not
        write, and `capture_failed`'s error once a capture of one has failed. `retry_failed` (a
        registration) queues failed ones again; `known`: manifests the caller just read (None: none)."""
        wanted: dict[str, set[int]] = {}
        for reg in regs:
            pid = reg.prompt_id
            manifest = known[pid] if pid in known else self.store.manifest(pid, fresh=True)
            missing = set(layers) - set(manifest.layers) if manifest is not None else {*layers, *self.capture_layers}
            if missing or retry_failed:  # a registration retries a failed capture of stored prompts too
                wanted[reg.prompt_id] = missing
        if not wanted:
            return
        self.check_writable()
        states = self.captures.request_many(wanted, retry_failed=retry_failed)
        self._wake.set()
        for prompt_id, state in states.items():
            if state.status == "failed":
                raise capture_failed(prompt_id, state.error)  # PromptFailed, or the store's own code

    def check_writable(self) -> None:
        """StoreReadOnly if the store is read-only: this server serves what is stored and captures nothing."""
        if is_read_only(self.store.blobs):
            raise StoreReadOnly("this server's store is read-only: it serves the prompts stored, and captures none")

    def finished(self, prompt_id: str) -> Future[None]:
        """Resolves when a capture of `prompt_id` next finishes (published or failed): on this server,
        or on any server when the database carries notices between them."""
        with self._lock:
            return self._finished.setdefault(prompt_id, Future())

    def in_progress(self, prompt_id: str) -> bool:
        """Whether a capture of `prompt_id` is queued or running on some server (a lock-free read)."""
        state = self.captures.state(prompt_id)
        return state is not None and state.status in ("queued", "running")

    def _on_notice(self, notice: Notice) -> None:
        ours = notice.namespace == self.captures.namespace
        if ours and notice.kind == "queued":
            self._wake.set()
        elif ours and notice.prompt_id is not None:
            self._wake_waiters(notice.prompt_id)

    # -- compute thread -------------------------------------------------------------------------

    def _compute_loop(self) -> None:
        backoff = _FIRST_BACKOFF_S
        while not self._stopping.is_set():
            try:
                self._compute_round()
            except Exception as e:  # the database away, say: keep trying, and say so on /healthz
                self.health.failing("compute", e)
                log.error("compute loop: %s (retrying in %.1f s)", e, backoff, exc_info=e)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
            else:
                self.health.ok("compute")
                backoff = _FIRST_BACKOFF_S

    def _compute_round(self) -> None:
        self._claim_more()
        if self.responses.waiting_in_process() and self.responses.ready_tokens() < self._batch_tokens:
            self.responses.generate_in_process()
        elif batch := self.responses.take(self._batch_tokens):
            self._run_batch(batch)
        else:
            self._wake.wait(self.poll_s)  # an engine's answer, new work, or a lease expired elsewhere
            self._wake.clear()

    def _claim_more(self) -> None:
        """Claim work while a capture batch or a generation slot has room."""
        while (
            not self._stopping.is_set()
            and not is_read_only(self.store.blobs)  # work queued by servers that may write is theirs
            and self.responses.ready_tokens() < self._batch_tokens
            and self.responses.generating() < self.responses.slots
        ):
            claimed = self.captures.claim()
            if claimed is None:
                return
            if (task := self._task_for(claimed.prompt_id, set(claimed.layers))) is not None:
                self.responses.add(task)

    def _task_for(self, pid: str, layers: set[int]) -> ComputeTask | None:
        """The task of a claim; None when it failed or another server already published it."""
        with self._lock:
            self._held.add(pid)
        try:
            reg = self.registry.get(pid)
            if reg is None:
                raise LookupError(f"prompt {pid} has capture work but no registration")
            manifest = self.store.manifest(pid, fresh=True)
        except Exception as e:
            self._fail(pid, e)
            return None
        wanted = layers - set(manifest.layers if manifest is not None else ())
        if manifest is not None and not wanted:  # published by a server that died before saying so
            self._finish(pid)
            return None
        return ComputeTask(reg, wanted)

    def _run_batch(self, batch: list[ComputeTask]) -> None:
        seqs, regs = [task.sequence or [] for task in batch], [task.reg for task in batch]
        layers = sorted(set().union(*(task.layers for task in batch)))
        try:
            with self.metrics.compute_seconds.time():
                outputs = self.target.capture(seqs, [r.prompt_len for r in regs], layers, [r.sampling for r in regs])
        except Exception as e:
            for task in batch:
                self._fail(task.reg.prompt_id, e)
            return
        self.metrics.prompts_computed.inc(len(batch))
        self._progress.computed(len(batch))
        for task, seq, out in zip(batch, seqs, outputs, strict=True):
            self._writers.submit(self._publish, task, seq, out)

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.captures.lease_s / 3):
            with self._lock:
                held = list(self._held)
            try:
                self.captures.renew(held)
            except Exception as e:  # the database is away: keep trying; the leases may expire meanwhile
                self.health.failing("capture-lease", e)
                log.warning("could not renew capture leases: %s", e)
            else:
                self.health.ok("capture-lease")

    def _publish(self, task: ComputeTask, seq: list[int], out: Captured) -> None:
        try:
            self.store.write(
                task.reg.prompt_id,
                np.asarray(seq, dtype=np.int64),
                task.reg.prompt_len,
                {k: out.states[k] for k in task.layers},
                greedy_mismatches=out.greedy_mismatches,
                outside_support=out.outside_support,
                generator=task.generator,
                sampling=task.reg.sampling,
            )
        except Exception as e:  # a full disk fails this prompt alone, as storage_exceeded
            self._fail(task.reg.prompt_id, store_write_error(e))
            return
        self._finish(task.reg.prompt_id)

    def _finish(self, prompt_id: str) -> None:
        try:
            if not self.captures.done(prompt_id):
                log.warning("prompt %s: published, but its capture lease had passed to another server", prompt_id)
        except Exception as e:  # its lease expires, and whoever takes the prompt over finds it published
            log.error("prompt %s: published, but the capture table could not say so: %s", prompt_id, e)
        self._release(prompt_id)

    def _fail(self, prompt_id: str, error: Exception) -> None:
        log.error("prompt %s failed: %s", prompt_id, error, exc_info=error)
        self.metrics.prompts_failed.inc()
        try:
            self.captures.fail(prompt_id, failure_text(error))
        except Exception as e:  # released all the same: its lease expires and the prompt is tried again
            log.error("prompt %s: its failure could not be recorded: %s", prompt_id, e)
        self._release(prompt_id)

    def _release(self, prompt_id: str) -> None:
        """No longer held here; wake this server's waiters."""
        with self._lock:
            self._held.discard(prompt_id)
        self._wake_waiters(prompt_id)

    def _wake_waiters(self, prompt_id: str) -> None:
        with self._lock:
            waiters = self._finished.pop(prompt_id, None)
        if waiters is not None:
            waiters.set_result(None)
