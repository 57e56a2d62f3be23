"""`create_app(settings)`: loads the target and the store in the lifespan and mounts the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_server.http_errors import install_error_handlers
from cache_server.jobs import JobStore
from cache_server.jobs_routes import jobs_router
from cache_server.metrics import Metrics
from cache_server.routes import router
from cache_server.service import HiddenStateService
from cache_server.settings import ServeSettings
from cache_server.store import HiddenStore
from cache_server.target import Target

JOBS_FILE = "jobs.sqlite"


def build_service(settings: ServeSettings) -> HiddenStateService:
    target = Target(settings.model, device=settings.device, dtype=settings.dtype)
    store = HiddenStore(
        settings.store,
        fingerprint=target.info.fingerprint,
        model_name=target.info.name,
        hidden_size=target.info.hidden_size,
        dtype=target.info.dtype,
        read_threads=settings.read_threads,
    )
    return HiddenStateService(
        target,
        store,
        capture_layers=settings.capture_layer_ids(target.info.num_layers),
        metrics=Metrics(),
        batch_tokens=settings.batch_tokens,
        wait_s=settings.wait_s,
    )


def create_app(
    settings: ServeSettings, build: Callable[[ServeSettings], HiddenStateService] = build_service
) -> FastAPI:
    """`build` is how tests pass in a service around a fake target."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service = build(settings)
        app.state.jobs = JobStore(settings.store / JOBS_FILE, max_attempts=settings.job_max_attempts)
        service.start()
        app.state.service = service
        try:
            yield
        finally:
            app.state.jobs.close()
            service.close()

    app = FastAPI(title="hidden-state-cache", lifespan=lifespan)
    app.state.token = settings.token.get_secret_value() if settings.token is not None else None
    app.state.checkpoint_root = settings.checkpoint_root
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(jobs_router)
    return app
