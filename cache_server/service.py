"""The hidden-state service: registers prompts, runs the target once per prompt, serves layer sets.

One compute thread owns the target and batches queued prompts; a small writer pool publishes the
results to the store. Every (prompt, missing layers) computation is single-flight: concurrent
requests for it share one future, and `cache_server_prompts_computed_total` counts each run.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from cache_server.errors import InvalidLayers, PromptFailed, PromptNotFound, PromptNotReady
from cache_server.heads_body import heads_body
from cache_server.metrics import Metrics
from cache_server.registry import Registration, Registry, prompt_id_for
from cache_server.store import HiddenStore, PromptManifest
from cache_server.target import Captured, Target
from schemas.prompts import GenerateSpec, PromptPage, PromptSpec, PromptState, PromptStatus, RegisteredPrompt

log = logging.getLogger(__name__)


@dataclass
class _Job:
    reg: Registration
    layers: set[int]
    future: Future[PromptManifest] = field(default_factory=Future)


class HiddenStateService:
    def __init__(
        self,
        target: Target,
        store: HiddenStore,
        *,
        capture_layers: Sequence[int],
        metrics: Metrics,
        batch_tokens: int = 8192,
        wait_s: float = 30.0,
    ) -> None:
        self.target = target
        self.store = store
        self.metrics = metrics
        self.capture_layers = sorted(capture_layers)
        self.registry = Registry(store.namespace / "requests")
        self._batch_tokens = batch_tokens
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._inflight: dict[str, _Job] = {}
        self._failed: dict[str, str] = {}
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._writers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store-writer")
        self._thread = threading.Thread(target=self._compute_loop, name="target-compute", daemon=True)
        self._stopping = threading.Event()

    def start(self) -> None:
        """Start computing, first re-queuing whatever was registered but never published."""
        self._thread.start()
        for reg in self.registry.all():
            if self.store.manifest(reg.prompt_id) is None:
                self._schedule(reg.prompt_id, self.capture_layers)

    def close(self) -> None:
        """Finish the batch in hand and stop; queued prompts stay registered and resume on restart."""
        self._stopping.set()
        self._queue.put(None)  # wakes the compute thread if it waits for work
        if self._thread.is_alive():
            self._thread.join()
        self._writers.shutdown(wait=True)
        self.store.close()

    # -- registration ---------------------------------------------------------------------------

    def register(self, specs: Sequence[PromptSpec], generate: GenerateSpec | None) -> list[RegisteredPrompt]:
        """Validate every prompt first (all or nothing), then queue the new ones."""
        regs = [self._registration(spec, generate) for spec in specs]
        out = []
        for reg in regs:
            with self._lock:
                retry = self._failed.pop(reg.prompt_id, None) is not None
            if self.registry.add(reg) or retry:
                self._schedule(reg.prompt_id, self.capture_layers)
            out.append(RegisteredPrompt(prompt_id=reg.prompt_id, status=self._status(reg.prompt_id)))
        return out

    def _registration(self, spec: PromptSpec, generate: GenerateSpec | None) -> Registration:
        prompt_ids = tuple(self.target.encode(spec))
        response = tuple(spec.response_token_ids) if spec.response_token_ids is not None else None
        max_new = generate.max_new_tokens if generate is not None and response is None else None
        self.target.check_length(len(prompt_ids) + (len(response) if response else max_new or 0))
        pid = prompt_id_for(prompt_ids, response, max_new)
        return Registration(
            prompt_id=pid,
            prompt_ids=prompt_ids,
            response_ids=response,
            max_new_tokens=max_new,
            name=spec.name,
        )

    # -- status ---------------------------------------------------------------------------------

    def _status(self, prompt_id: str) -> PromptStatus:
        if self.store.manifest(prompt_id) is not None:
            return PromptStatus.ready
        with self._lock:
            return PromptStatus.failed if prompt_id in self._failed else PromptStatus.pending

    def state(self, prompt_id: str, *, with_tokens: bool = True) -> PromptState:
        """A prompt's status; listings leave out token_ids (a store read per prompt)."""
        reg = self._registered(prompt_id)
        manifest = self.store.manifest(prompt_id)
        tokens: list[int] | None = None
        if manifest is not None:
            num_tokens: int | None = manifest.num_tokens
            if with_tokens:
                tokens = self.store.token_ids(prompt_id).tolist()
        elif reg.response_ids is not None:
            num_tokens = reg.prompt_len + len(reg.response_ids)
            tokens = list(reg.prompt_ids) + list(reg.response_ids) if with_tokens else None
        else:
            num_tokens = None  # the response is not generated yet
        with self._lock:
            error = self._failed.get(prompt_id)
        return PromptState(
            prompt_id=prompt_id,
            name=reg.name,
            status=self._status(prompt_id),
            prompt_len=reg.prompt_len,
            num_tokens=num_tokens,
            token_ids=tokens,
            layers_stored=list(manifest.layers) if manifest else [],
            greedy_mismatches=manifest.greedy_mismatches if manifest else None,
            error=error,
        )

    def page(self, offset: int, limit: int, status: PromptStatus | None = None) -> PromptPage:
        regs = self.registry.all()
        if status is not None:
            regs = [r for r in regs if self._status(r.prompt_id) == status]
        states = [self.state(r.prompt_id, with_tokens=False) for r in regs[offset : offset + limit]]
        return PromptPage(prompts=states, total=len(regs), offset=offset, limit=limit)

    def evaluable_prompt_ids(self) -> list[str]:
        """What a job's `prompts: "all"` means: every registered prompt the target has not failed on
        (as `eval-worker evaluate --all-prompts` takes them)."""
        with self._lock:
            failed = set(self._failed)
        return [r.prompt_id for r in self.registry.all() if r.prompt_id not in failed]

    @cached_property
    def heads(self) -> bytes:
        """`GET /target/heads`, serialised once: the heads never change while the target is loaded."""
        return heads_body(self.target)

    def _registered(self, prompt_id: str) -> Registration:
        reg = self.registry.get(prompt_id)
        if reg is None:
            raise PromptNotFound(f"no prompt {prompt_id!r} is registered for target {self.target.info.fingerprint}")
        return reg

    # -- layers ---------------------------------------------------------------------------------

    def check_layers(self, layers: Sequence[int]) -> None:
        n = self.target.info.num_layers
        if not layers:
            raise InvalidLayers(f"no layers asked for; valid layer ids are 0..{n - 1}")
        bad = [k for k in layers if not 0 <= k < n]
        if bad:
            raise InvalidLayers(f"layer ids {bad} are outside the target's 0..{n - 1} (0-based decoder outputs)")
        if len(set(layers)) != len(layers):
            raise InvalidLayers(f"duplicated layer ids in {list(layers)}; valid layer ids are 0..{n - 1}")

    async def ensure(self, prompt_id: str, layers: Sequence[int]) -> PromptManifest:
        """The published manifest once it holds `layers`, computing them at most once."""
        self._registered(prompt_id)
        deadline = time.monotonic() + self._wait_s
        while True:
            manifest = self.store.manifest(prompt_id)
            if manifest is not None and set(layers) <= set(manifest.layers):
                return manifest
            job = self._schedule(prompt_id, layers)
            remaining = deadline - time.monotonic()
            try:
                # shield: a waiter timing out must not cancel the shared computation.
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)), max(remaining, 0.0))
            except TimeoutError:
                raise PromptNotReady(
                    f"prompt {prompt_id} is still being computed after {self._wait_s:.0f} s", retry_after_s=5
                ) from None

    def _schedule(self, prompt_id: str, layers: Sequence[int]) -> _Job:
        """The in-flight job that will provide `layers`, queuing a new one only if none will."""
        reg = self._registered(prompt_id)
        with self._lock:
            if prompt_id in self._failed:
                raise PromptFailed(f"prompt {prompt_id} failed: {self._failed[prompt_id]}")
            job = self._inflight.get(prompt_id)
            if job is not None:
                return job  # the caller re-checks the layers once it is done
            manifest = self.store.manifest(prompt_id)
            stored = set(manifest.layers) if manifest else set()
            wanted = set(layers) - stored if manifest else set(layers) | set(self.capture_layers)
            job = _Job(reg=reg, layers=wanted)
            if not wanted:
                job.future.set_result(manifest)  # type: ignore[arg-type]
                return job
            self._inflight[prompt_id] = job
        self._queue.put(job)
        return job

    # -- compute thread -------------------------------------------------------------------------

    def _compute_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None or self._stopping.is_set():
                return
            batch, tokens = [job], self._token_estimate(job)
            while tokens < self._batch_tokens:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
                tokens += self._token_estimate(nxt)
            self._run_batch(batch)

    @staticmethod
    def _token_estimate(job: _Job) -> int:
        reg = job.reg
        return reg.prompt_len + (len(reg.response_ids) if reg.response_ids else reg.max_new_tokens or 0)

    def _run_batch(self, batch: list[_Job]) -> None:
        ready = self._sequences(batch)
        if not ready:
            return
        layers = sorted(set().union(*(job.layers for job, _ in ready)))
        try:
            with self.metrics.compute_seconds.time():
                outputs = self.target.capture([seq for _, seq in ready], [j.reg.prompt_len for j, _ in ready], layers)
        except Exception as e:
            for job, _ in ready:
                self._fail(job, e)
            return
        self.metrics.prompts_computed.inc(len(ready))
        for (job, seq), out in zip(ready, outputs, strict=True):
            self._writers.submit(self._publish, job, seq, out)

    def _sequences(self, batch: list[_Job]) -> list[tuple[_Job, list[int]]]:
        """Prompt + response tokens of each job: stored, given, or the target's greedy response
        (generated in batches of one max_new_tokens). A job that fails here fails alone."""
        known: dict[int, list[int]] = {}
        to_generate: dict[int, list[int]] = {}  # max_new_tokens -> indices into batch
        for i, job in enumerate(batch):
            reg = job.reg
            try:
                if self.store.manifest(reg.prompt_id) is not None:
                    known[i] = [int(t) for t in self.store.token_ids(reg.prompt_id)]
                elif reg.response_ids is not None or reg.max_new_tokens is None:
                    known[i] = list(reg.prompt_ids) + list(reg.response_ids or ())
                else:
                    to_generate.setdefault(reg.max_new_tokens, []).append(i)
            except Exception as e:
                self._fail(job, e)
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

    def _publish(self, job: _Job, seq: list[int], out: Captured) -> None:
        layers = {k: out.states[k] for k in job.layers}
        try:
            manifest = self.store.write(
                job.reg.prompt_id,
                np.asarray(seq, dtype=np.int64),
                job.reg.prompt_len,
                layers,
                greedy_mismatches=out.greedy_mismatches,
            )
        except Exception as e:
            self._fail(job, e)
            return
        with self._lock:
            self._inflight.pop(job.reg.prompt_id, None)
        job.future.set_result(manifest)

    def _fail(self, job: _Job, error: Exception) -> None:
        pid = job.reg.prompt_id
        log.error("prompt %s failed: %s", pid, error, exc_info=error)
        self.metrics.prompts_failed.inc()
        message = f"{type(error).__name__}: {error}"
        with self._lock:
            self._inflight.pop(pid, None)
            self._failed[pid] = message
        job.future.set_exception(PromptFailed(f"prompt {pid} failed: {message}"))
