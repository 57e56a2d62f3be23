"""`create_app(settings)`: loads the target and the store in the lifespan and mounts the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from cache_server.http_errors import install_error_handlers
from cache_server.metrics import Metrics
from cache_server.routes import router
from cache_server.service import HiddenStateService
from cache_server.settings import ServeSettings
from cache_server.store import HiddenStore
from cache_server.target import Target


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
        service.start()
        app.state.service = service
        try:
            yield
        finally:
            service.close()

    app = FastAPI(title="hidden-state-cache", lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(router)
    return app
