"""HTTP routes: parse, call the service, return. Blocking work runs in threads, never on the loop."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cache_server.auth import WriteAccess
from cache_server.dtypes import dtype_name
from cache_server.errors import InvalidLayers
from cache_server.hidden_body import hidden_body, token_range
from cache_server.service import HiddenStateService
from schemas.model import ModelInfo
from schemas.prompts import PromptPage, PromptState, PromptStatus, RegisterRequest, RegisterResponse

SAFETENSORS = "application/octet-stream"


def get_service(request: Request) -> HiddenStateService:
    return request.app.state.service


ServiceDep = Annotated[HiddenStateService, Depends(get_service)]
router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/model")
def model(service: ServiceDep) -> ModelInfo:
    info = service.target.info
    return ModelInfo(
        name=info.name,
        fingerprint=info.fingerprint,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        vocab_size=info.vocab_size,
        max_position_embeddings=info.max_positions,
        dtype=dtype_name(info.dtype),
        capture_layers=service.capture_layers,
    )


@router.post("/prompts", status_code=202, dependencies=[WriteAccess])
def register(body: RegisterRequest, service: ServiceDep) -> RegisterResponse:
    return RegisterResponse(prompts=service.register(body.prompts, body.generate))


@router.get("/prompts")
def list_prompts(
    service: ServiceDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    status: PromptStatus | None = None,
) -> PromptPage:
    return service.page(offset, limit, status)


@router.get("/prompts/{prompt_id}")
def prompt_state(prompt_id: str, service: ServiceDep) -> PromptState:
    return service.state(prompt_id)


def parse_layers(text: str, num_layers: int) -> list[int]:
    try:
        return [int(part) for part in text.split(",")] if text.strip() else []
    except ValueError:
        raise InvalidLayers(f"layers must be comma-separated integers in 0..{num_layers - 1}, got {text!r}") from None


@router.get("/hidden")
async def hidden(
    service: ServiceDep,
    prompt_id: str,
    layers: str,
    start: int | None = None,
    stop: int | None = None,
) -> Response:
    ids = parse_layers(layers, service.target.info.num_layers)
    service.check_layers(ids)
    manifest = await service.ensure(prompt_id, ids)
    lo, hi = token_range(manifest, start, stop)
    body = await run_in_threadpool(hidden_body, service.store, manifest, ids, lo, hi)
    service.metrics.hidden_requests.inc()
    service.metrics.hidden_bytes.inc(body.buffer.nbytes)
    return Response(content=body.as_memoryview(), media_type=SAFETENSORS)


@router.get("/target/heads")
async def target_heads(service: ServiceDep) -> Response:
    return Response(content=await run_in_threadpool(lambda: service.heads), media_type=SAFETENSORS)


@router.get("/metrics")
def metrics(service: ServiceDep) -> Response:
    return Response(content=service.metrics.render(), media_type="text/plain; version=0.0.4")
