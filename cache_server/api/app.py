"""`create_app(settings)`: opens the target, the store and the job queue in the lifespan and mounts
the routes."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_server.api.error_handlers import install_error_handlers
from cache_server.api.jobs_routes import jobs_router
from cache_server.api.page import page_router
from cache_server.api.routes import router
from cache_server.api.tensor_bodies import TensorBodies
from cache_server.capture.target import ModelShape, Target, open_hf_target
from cache_server.capture.tokenizer import stop_token_ids
from cache_server.compute.instances import default_db_location
from cache_server.compute.metrics import Metrics
from cache_server.compute.service import HiddenStateService
from cache_server.coordination.database import Database
from cache_server.generation.engine import EngineClient, connect
from cache_server.generation.engine_target import open_engine_target
from cache_server.generation.startup import checked_engine
from cache_server.jobs.queue import JobStore
from cache_server.settings import ServeSettings
from cache_server.store.blobs import Blobs
from cache_server.store.errors import StoreInputError
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.locations import open_blobs
from cache_server.store.ram_cache import RamCache
from cache_server.store.read_only import ReadOnlyBlobs, is_read_only, write_refused
from cache_server.store.usage import StoredBytesScan
from cache_server.torch_utils import TORCH_DTYPES

DESCRIPTION = (
    "Runs a target LLM once per prompt, stores every decoder layer's output, and serves any layer set "
    "concatenated per token. Layer id k is the output of decoder layer k, counting from 0. Errors are "
    '`{"error": {"code", "message"}}`. A GET request line, with its layer list, must stay under the '
    "HTTP parser's limit (about 64 KiB); a longer one gets a 400 `bad_http_request`."
)

log = logging.getLogger(__name__)


def open_store_blobs(settings: ServeSettings) -> Blobs:
    """The store's objects: read-only (`ReadOnlyBlobs`) with `--read-only` (nothing is written, not even
    a probe) or when a local store refuses a write probe, and then the coordination database must be
    named (`--db`): its default lives in the store."""
    blobs = open_blobs(settings.store)
    refused = None if settings.read_only else write_refused(blobs)
    if not settings.read_only and refused is None:
        return blobs
    reason = "--read-only" if refused is None else refused.strerror or str(refused)
    if settings.db is None:
        raise StoreInputError(
            f"store {blobs.location} is read-only ({reason}), and the coordination database defaults to a "
            "file in it: pass --db (a copy of its coordination.sqlite elsewhere, or the database its writers share)"
        )
    log.warning(
        "store %s is read-only (%s): serving what it holds, registering and capturing nothing", blobs.location, reason
    )
    return ReadOnlyBlobs(blobs, reason)


def open_target(settings: ServeSettings) -> tuple[Target, EngineClient | None]:
    """The target and the engine that generates its responses (when there is one), checked: in this
    process (`--capture hf`), or captured by the engine itself (`--capture engine`)."""
    concurrency, timeout_s = settings.generator_concurrency, settings.generator_timeout_s
    if settings.capture == "engine":
        if settings.engine_files is None:  # refused by the settings already; said again for the type checker
            raise ValueError("--capture engine needs --engine-files DIR")
        shape = ModelShape.of(settings.model)
        engine = connect(
            settings.generator,
            model=settings.generator_model,
            target_name=settings.model.resolve().name,
            stop_token_ids=stop_token_ids(settings.model),
            timeout_s=timeout_s,
        )
        target = open_engine_target(
            settings.model,
            engine,
            files=settings.engine_files,
            capture_layers=settings.capture_layer_ids(shape.num_layers),
            storage=settings.store_dtype,
            timeout_s=timeout_s,
            concurrency=concurrency,
            orphan_after_s=settings.capture_lease_s,
            dtype=settings.dtype,
        )
        return target, EngineClient(engine, timeout_s=timeout_s, concurrency=concurrency, files=settings.engine_files)
    target = open_hf_target(
        settings.model,
        device=settings.device,
        dtype=settings.dtype,
        device_map=settings.device_map,
        storage=settings.store_dtype,
    )
    if settings.generator == "hf":
        return target, None
    url, model = settings.generator, settings.generator_model
    return target, checked_engine(url, target, model=model, timeout_s=timeout_s, concurrency=concurrency)


def build_service(settings: ServeSettings) -> HiddenStateService:
    """Load the target, check the engine that generates its responses (when there is one) and open
    its store namespace; EngineUnfit when the engine cannot serve as this target's generator,
    StoreInputError for a store it cannot open so (read-only without `--db`)."""
    blobs = open_store_blobs(settings)  # before the weights load: a read-only store without --db fails now
    target, engine = open_target(settings)
    metrics = Metrics()
    ram = RamCache(int(settings.ram_cache_gb * 2**30)) if settings.ram_cache_gb > 0 else None
    if ram is not None:
        metrics.watch_ram_cache(ram)
    store = HiddenStore(
        blobs,
        fingerprint=target.info.fingerprint,
        model_name=target.info.name,
        hidden_size=target.info.hidden_size,
        dtype=TORCH_DTYPES[target.info.dtype],
        read_threads=settings.read_threads,
        ram_cache=ram,
        orphan_grace_s=math.inf if is_read_only(blobs) else settings.orphan_grace_s,  # inf: no sweep
        storage=target.info.storage,
    )
    metrics.watch_stored_bytes(StoredBytesScan(store.blobs, settings.stored_bytes_refresh_s))
    return HiddenStateService(
        target,
        store,
        capture_layers=settings.capture_layer_ids(target.info.num_layers),
        metrics=metrics,
        db=Database(settings.db or default_db_location(store), lock_timeout_s=settings.db_lock_timeout_s),
        instance=settings.instance,
        capture_lease_s=settings.capture_lease_s,
        batch_tokens=settings.batch_tokens,
        generate_batch=settings.generate_batch,
        engine=engine,
        generator_concurrency=settings.generator_concurrency,
        unhealthy_after_s=settings.unhealthy_after_s,
        wait_s=settings.wait_s,
    )


def create_app(
    settings: ServeSettings, build: Callable[[ServeSettings], HiddenStateService] = build_service
) -> FastAPI:
    """The cache server's app; `build` is how tests pass in a service around a fake target."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = build(settings)
        try:
            app.state.jobs = JobStore(service.db, max_attempts=settings.job_max_attempts)
        except BaseException:
            service.close()  # it holds read and write pools
            raise
        service.start()
        app.state.service = service
        app.state.tensors = TensorBodies(
            service.store, service.target, service.recapture, stream=settings.stream_hidden
        )
        try:
            yield
        finally:
            app.state.tensors.close()
            app.state.jobs.close()
            service.close()

    app = FastAPI(title="hidden-state-cache", description=DESCRIPTION, lifespan=lifespan)
    app.state.token = settings.token.get_secret_value() if settings.token is not None else None
    app.state.checkpoint_root = settings.checkpoint_root
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(jobs_router)
    app.include_router(page_router)
    return app
