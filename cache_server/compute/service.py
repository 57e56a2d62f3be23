"""`HiddenStateService`, what the HTTP routes call: register prompts, report their status, and
hand out stored layers, computing a missing one at most once (through the `Scheduler`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from cache_server.capture.captured import uncapturable
from cache_server.capture.target import Target
from cache_server.compute.health import Health
from cache_server.compute.instances import default_db_location, default_instance, import_store_registrations
from cache_server.compute.metrics import Metrics
from cache_server.compute.prompt_specs import fill_in_answers, registrations_for
from cache_server.compute.prompt_states import PromptStates
from cache_server.compute.registry import Registration, Registry
from cache_server.compute.room import check_room
from cache_server.compute.scheduler import Scheduler
from cache_server.compute.sets import SetRegistry
from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database
from cache_server.errors import (
    InvalidLayers,
    PromptNotReady,
    ServerUnhealthy,
    StoredDataCorrupt,
)
from cache_server.generation.engine import EngineClient
from cache_server.store.errors import LayersNotStored, StoreCorrupt
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from cache_server.store.read_only import is_read_only
from cache_server.store.usage import CodecRatio, free_bytes
from schemas.layers import (
    LAYER_CONVENTION,
    RequestLayerConvention,
    decoder_outputs,
    layer_list_problem,
    parse_layer_list,
)
from schemas.model import ModelInfo
from schemas.plan import StoragePlan
from schemas.prompts import GenerateSpec, PromptSpec, RegisteredPrompt

log = logging.getLogger(__name__)
R = TypeVar("R")
# Builds what `GET /hidden` sends from a published prompt's rows start:stop: (bytes sent, the response).
SendRows = Callable[[PromptManifest, int, int], Awaitable[tuple[int, R]]]


class HiddenStateService:
    """One target, its store and its scheduler: prompts in, stored layer sets out.

    `db` is the coordination database shared with the other servers on the store (default: SQLite
    next to a local store); the service closes it. `instance` names this server among them.
    `capture_attempts`: how often a prompt's capture is tried before it fails (a server dying under
    it, its lease expiring; an engine answering without writing its capture file)."""

    # keyword-only settings, each named at its one call (build_service)
    def __init__(  # noqa: PLR0913
        self,
        target: Target,
        store: HiddenStore,
        *,
        capture_layers: Sequence[int],
        metrics: Metrics,
        db: Database | None = None,
        instance: str | None = None,
        capture_lease_s: float = 30.0,
        capture_attempts: int = 10,
        batch_tokens: int = 8192,
        generate_batch: int = 16,
        engine: EngineClient | None = None,
        generator_concurrency: int = 64,
        unhealthy_after_s: float = 30.0,
        wait_s: float = 30.0,
    ) -> None:
        self.target = target
        self.store = store
        self._codec_ratio = CodecRatio(store)
        self.metrics = metrics
        self.instance = instance or default_instance()
        self.db = db if db is not None else Database(default_db_location(store))
        ns = store.namespace
        self.registry, self.sets = Registry(self.db, ns), SetRegistry(self.db, ns)
        captures = CaptureQueue(self.db, ns, self.instance, lease_s=capture_lease_s, max_attempts=capture_attempts)
        self.prompts = PromptStates(store, self.registry, self.sets, captures)
        metrics.watch_pending(self.prompts.pending_count)
        metrics.name_instance(self.instance)
        self.health = Health(bound_s=unhealthy_after_s)
        self.scheduler = Scheduler(
            target,
            store,
            metrics,
            captures,
            self.registry,
            capture_layers=capture_layers,
            batch_tokens=batch_tokens,
            generate_batch=generate_batch,
            engine=engine,
            generator_concurrency=generator_concurrency,
            health=self.health,
        )
        self._wait_s = wait_s

    @property
    def capture_layers(self) -> list[int]:
        """The layers stored for every prompt (others are computed when first asked for)."""
        return self.scheduler.capture_layers

    def start(self) -> None:
        """Start computing (registrations of a store written before the coordination database are
        taken over first, and so is whatever was registered but never captured)."""
        import_store_registrations(self.store, self.registry, self.sets)
        captures = self.prompts.captures.states()
        unstored = (r for r in self.registry.all() if r.prompt_id not in captures)
        todo = [r for r in unstored if self.store.manifest(r.prompt_id) is None]
        if not is_read_only(self.store.blobs):  # else they wait for a server that may write the store
            self.scheduler.request_many(todo, self.capture_layers, known=dict.fromkeys(r.prompt_id for r in todo))
        self.scheduler.start()

    def close(self) -> None:
        """Finish the batch in hand and stop; queued prompts stay queued for any server on the store."""
        self.scheduler.close()
        self.target.capturer.close()
        self.store.close()
        self.db.close()

    def check_health(self) -> None:
        """ServerUnhealthy naming every dead or long-failing background loop."""
        problems = self.health.problems()
        if problems:
            raise ServerUnhealthy("; ".join(problems))

    def model_info(self) -> ModelInfo:
        """`GET /model`."""
        return ModelInfo(
            **self.target.info.model_dump(),
            capture_layers=self.capture_layers,
            generator=self.scheduler.responses.generator,
            chat_template_sha256=self.target.prompts.chat_template_sha256,
            instance=self.instance,
        )

    # -- registration ---------------------------------------------------------------------------

    def register(self, specs: Sequence[PromptSpec], generate: GenerateSpec | None) -> list[RegisteredPrompt]:
        """Validate every prompt first (all or nothing), then queue the new ones (and failed ones again)."""
        self.scheduler.check_writable()  # a read-only store: no registration at all, rather than some
        per_spec = [
            registrations_for(
                fill_in_answers(spec, self.registry, self.store, self.target.prompts), generate, self.target.prompts
            )
            for spec in specs
        ]
        regs = [r for samples in per_spec for r in samples]
        self._check_room(regs)
        new = self.registry.add_many(regs)  # one transaction for all, and one for their capture work
        self.scheduler.request_many(regs, self.capture_layers, retry_failed=True, known=dict.fromkeys(new))
        captures = self.prompts.captures.states()
        out = [RegisteredPrompt(prompt_id=r.prompt_id, status=self.prompts.status(r.prompt_id, captures)) for r in regs]
        for name in dict.fromkeys(n for spec in specs for n in spec.sets):
            pairs = zip(per_spec, specs, strict=True)
            self.sets.add(name, [r.prompt_id for samples, spec in pairs if name in spec.sets for r in samples])
        return out

    def plan(self, prompts: int, tokens: int) -> StoragePlan:
        """`tokens` tokens over `prompts` prompts, as this server would store them: its target, capture
        layers and dtype, the codec ratio measured on its store (else the documented one), the free space."""
        info, (ratio, source) = self.target.info, self._codec_ratio.get()
        return StoragePlan.project(
            target=info.name,
            num_layers=info.num_layers,
            hidden_size=info.hidden_size,
            dtype=info.dtype,
            storage=self.store.storage,
            capture_layers=self.capture_layers,
            prompts=prompts,
            tokens=tokens,
            codec_ratio=ratio,
            codec_ratio_source=source,
            free_bytes=free_bytes(self.store),
        )

    def plan_registration(self, specs: Sequence[PromptSpec], generate: GenerateSpec | None) -> StoragePlan:
        """`POST /plan`: what registering these prompts would store (the ones not registered yet; a
        response to generate counted at its full `max_new_tokens`), validated as `register` does."""
        return self._planned(
            [
                r
                for spec in specs
                for r in registrations_for(
                    fill_in_answers(spec, self.registry, self.store, self.target.prompts), generate, self.target.prompts
                )
            ]
        )

    def _planned(self, regs: Sequence[Registration]) -> StoragePlan:
        new = [r for r in regs if self.registry.get(r.prompt_id) is None]
        return self.plan(len(new), sum(r.prompt_len + len(r.response_ids or ()) + (r.max_new_tokens or 0) for r in new))

    def _check_room(self, regs: Sequence[Registration]) -> None:
        """StorageExceeded, before anything is written, if the new prompts' capture layers, and what the
        prompts registered but not captured yet will write, would not fit a local store (`room.py`)."""
        if free_bytes(self.store) is not None:
            check_room(self._planned(regs), self.prompts.captures, self.registry)

    def _registrations(self, spec: PromptSpec, generate: GenerateSpec | None) -> list[Registration]:
        filled = fill_in_answers(spec, self.registry, self.store, self.target.prompts)
        return registrations_for(filled, generate, self.target.prompts)

    def is_registered(self, prompt_id: str) -> bool:
        """Whether a prompt with this id is registered for the target."""
        return self.registry.get(prompt_id) is not None

    # -- layers ---------------------------------------------------------------------------------

    def layer_ids(self, text: str, convention: RequestLayerConvention = LAYER_CONVENTION) -> list[int]:
        """A `layers=` parameter (in `convention`) as distinct layer ids of the target; InvalidLayers naming
        the valid range."""
        n = self.target.info.num_layers
        in_hf = f" (hf_index: decoder output + 1, so 1..{n})" if convention == "hf_index" else ""
        try:
            layers = decoder_outputs(parse_layer_list(text), convention)
        except ValueError as e:
            raise InvalidLayers(f"{e}; valid layer ids are 0..{n - 1}{in_hf}") from None
        problem = layer_list_problem(layers, n) or uncapturable(layers, self.target.capturer)
        if problem is not None:
            raise InvalidLayers(problem + in_hf)
        return layers

    async def ensure(self, prompt_id: str, layers: Sequence[int]) -> PromptManifest:
        """The published manifest once it holds `layers`, computed at most once across the servers
        on the store: asked for once, then woken when a capture of the prompt finishes (polling is a
        safety net), asked for again only when no capture of it is queued or running."""
        # Off the event loop: a registration added by another server, or a manifest not read yet, is a
        # database or store read.
        reg = await asyncio.to_thread(self.prompts.registered, prompt_id)
        deadline = time.monotonic() + self._wait_s
        manifest = await asyncio.to_thread(self.store.manifest, prompt_id)
        fresh = False  # `manifest` was just read from the store (else it may be a stale copy)
        while manifest is None or not set(layers) <= set(manifest.layers):
            finished = self.scheduler.finished(prompt_id)  # before asking, so that no wake-up is missed
            # Asked on the first round, and again only once no capture of it is queued or running;
            # request_many raises PromptFailed once the target has failed on it.
            if not fresh or not await asyncio.to_thread(self.scheduler.in_progress, prompt_id):
                known = {prompt_id: manifest} if fresh else {}
                await asyncio.to_thread(self.scheduler.request_many, [reg], layers, known=known)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PromptNotReady(
                    f"prompt {prompt_id} is still being computed after {self._wait_s:.0f} s", retry_after_s=5
                )
            with contextlib.suppress(TimeoutError):  # shield: a waiter timing out must not cancel it
                wait_s = min(remaining, self.scheduler.poll_s)
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(finished)), wait_s)
            manifest, fresh = await asyncio.to_thread(self.store.manifest, prompt_id, fresh=True), True
        return manifest

    async def hidden(
        self, prompt_id: str, layers: Sequence[int], start: int | None, stop: int | None, send: SendRows[R]
    ) -> R:
        """What `send` makes of rows start:stop (default: all) of `layers` of a prompt once they are stored
        (`ensure` waits); bytes that do not decode have their layers captured again (StoredDataCorrupt)."""
        manifest = await self.ensure(prompt_id, layers)
        try:
            try:
                nbytes, sent = await send(manifest, *_token_range(manifest, start, stop))
            except LayersNotStored:  # pruned since this server read the manifest: captured again, once
                manifest = await self.ensure(prompt_id, layers)
                nbytes, sent = await send(manifest, *_token_range(manifest, start, stop))
        except StoreCorrupt as e:
            raise await asyncio.to_thread(self.recapture, prompt_id, e) from e
        self.metrics.hidden_requests.inc()
        self.metrics.hidden_bytes.inc(nbytes)
        return sent

    def recapture(self, prompt_id: str, error: StoreCorrupt) -> StoredDataCorrupt:
        """Stored bytes of a published prompt do not decode: its bad layers are no longer served (its
        manifest is published without them) and are queued for capture; the error to answer with."""
        self.metrics.stored_data_corrupt.inc()
        if not error.layers or is_read_only(self.store.blobs):  # token ids no capture mends, or no capture
            log.error("prompt %s: %s; not served", prompt_id, error)
            return StoredDataCorrupt(f"{error}; not served", retry_after_s=None)
        log.error("prompt %s: %s; capturing layers %s again", prompt_id, error, list(error.layers))
        self.store.forget_layers(prompt_id, error.layers)
        self.scheduler.request_many([self.prompts.registered(prompt_id)], error.layers)
        return StoredDataCorrupt(f"{error}; being captured again", retry_after_s=1)


def _token_range(manifest: PromptManifest, start: int | None, stop: int | None) -> tuple[int, int]:
    """The rows `[start, stop)` of a prompt (default: all of them); InvalidLayers if out of range."""
    n = manifest.num_tokens
    lo, hi = 0 if start is None else start, n if stop is None else stop
    if not 0 <= lo < hi <= n:
        raise InvalidLayers(f"token range start={start} stop={stop} is invalid; need 0 <= start < stop <= {n}")
    return lo, hi
