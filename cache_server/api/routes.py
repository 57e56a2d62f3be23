"""HTTP routes of the target, prompts and hidden states: parse, call the service, return.
Blocking work runs in threads, never on the event loop."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from cache_server.api.auth import WriteAccess
from cache_server.api.deps import JobsDep, ServiceDep, TensorsDep
from cache_server.api.error_handlers import error_responses
from cache_server.api.tensor_bodies import SAFETENSORS
from cache_server.jobs.layer_usage import layer_usage
from schemas.errors import ErrorCode as E
from schemas.hidden import FinalNormMode, LayerRequest
from schemas.layers import LAYER_CONVENTION, MAX_OFFSET, AsciiInt, RequestLayerConvention, parse_layer_list
from schemas.model import ModelInfo
from schemas.plan import LayerUsage, StoragePlan
from schemas.prompts import PromptPage, PromptState, PromptStatus, RegisterRequest, RegisterResponse, SetList

PROMETHEUS = "text/plain; version=0.0.4"


def _binary(media_type: str, what: str, *codes: E) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of a route whose 200 body is not JSON."""
    ok = {"description": what, "content": {media_type: {"schema": {"type": "string", "format": "binary"}}}}
    return {200: ok, **error_responses(*codes)}


router = APIRouter()


@router.get("/healthz", responses=error_responses(E.server_unhealthy))
def healthz(service: ServiceDep) -> dict[str, str]:
    """Health: ok once the target is loaded and the store is open, while every background loop runs and
    succeeds; 503 `server_unhealthy` naming the loop once one is dead or has failed past its bound."""
    service.check_health()
    return {"status": "ok"}


@router.get("/model", responses=error_responses())
def model(service: ServiceDep) -> ModelInfo:
    """The target whose states are served: name, fingerprint, shape, dtype, layer convention."""
    return service.model_info()


@router.post(
    "/prompts",
    status_code=202,
    dependencies=[WriteAccess],
    responses=error_responses(E.unauthorized, E.invalid_prompt, E.storage_exceeded, E.store_read_only),
)
def register(body: RegisterRequest, service: ServiceDep) -> RegisterResponse:
    """Register prompts (all or none); each is computed once, in the background. Ids are content-addressed."""
    return RegisterResponse(prompts=service.register(body.prompts, body.generate))


@router.get("/prompts", responses=error_responses(E.unknown_sets))
def list_prompts(
    service: ServiceDep,
    offset: Annotated[AsciiInt, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[AsciiInt, Query(ge=1, le=1000)] = 100,
    status: PromptStatus | None = None,
    set: Annotated[str | None, Query(description="only the prompts of this set")] = None,
) -> PromptPage:
    """One page of the registered prompts (without token ids), optionally of one status and one set."""
    return service.prompts.page(offset, limit, status, set)


@router.get("/sets", responses=error_responses())
def list_sets(service: ServiceDep) -> SetList:
    """Every prompt set, with its prompts counted by status."""
    return service.prompts.set_counts()


@router.get("/prompts/{prompt_id}", responses=error_responses(E.prompt_not_found))
def prompt_state(prompt_id: str, service: ServiceDep) -> PromptState:
    """One prompt's status, token ids, stored layers and greedy check."""
    return service.prompts.state(prompt_id)


@router.get(
    "/hidden",
    response_class=Response,
    responses=_binary(
        SAFETENSORS,
        "safetensors: hidden [T, len(layers) * H] in the order asked, token_ids [T] int64, and __metadata__",
        E.invalid_layers,
        E.prompt_not_found,
        E.prompt_failed,
        E.prompt_not_ready,
        E.stored_data_corrupt,
        E.storage_exceeded,
        E.store_read_only,
    ),
)
async def hidden(
    service: ServiceDep,
    tensors: TensorsDep,
    prompt_id: str,
    layers: Annotated[str, Query(description="comma-separated layer ids, e.g. 1,16,31 (0-based decoder outputs)")],
    start: AsciiInt | None = None,
    stop: AsciiInt | None = None,
    encoding: Annotated[
        Literal["safetensors", "pieces"],
        Query(description="pieces: the stored compressed pieces, for clients that decode"),
    ] = "safetensors",
    layer_convention: Annotated[
        RequestLayerConvention,
        Query(description="hf_index: layer ids are HF hidden_states indices (decoder output + 1; 0 is not stored)"),
    ] = LAYER_CONVENTION,
    final_norm: Annotated[
        FinalNormMode,
        Query(description="post: the target's last layer after its final norm (safetensors only); raw: as stored"),
    ] = "raw",
) -> Response:
    """The hidden states of `layers` of one prompt, concatenated per token in the order asked.

    Waits for a pending prompt up to the server's `--wait-s`, then answers 503 with Retry-After."""
    ids = service.layer_ids(layers, layer_convention)
    asked = LayerRequest(tuple(parse_layer_list(layers)), layer_convention, final_norm)
    return await service.hidden(prompt_id, ids, start, stop, tensors.hidden(ids, encoding, asked))


@router.get("/plan", responses=error_responses())
def plan(
    service: ServiceDep,
    prompts: Annotated[int, Query(ge=1, le=10**9, description="prompts to capture")],
    tokens: Annotated[int, Query(ge=1, le=10**8, description="tokens per prompt, prompt and response together")],
) -> StoragePlan:
    """What a capture would store: bytes per token per layer, the codec's ratio (measured on this store's
    prompts, else the documented figure), all layers and the capture layers, and the store's free space."""
    return service.plan(prompts, prompts * tokens)


@router.post("/plan", responses=error_responses(E.invalid_prompt))
def plan_registration(service: ServiceDep, body: RegisterRequest) -> StoragePlan:
    """What registering these prompts (the body `POST /prompts` takes) would store, without registering
    them: the new ones only, a response to generate counted at its full `max_new_tokens`."""
    return service.plan_registration(body.prompts, body.generate)


@router.get("/layers/usage", responses=error_responses())
def layers_usage(
    jobs: JobsDep, days: Annotated[float, Query(gt=0, le=36500, description="jobs finished this many days back")] = 30
) -> LayerUsage:
    """Which layer sets the jobs done in the last `days` days read, and their union: the layers a store
    keeping only some must keep for those checkpoints."""
    return layer_usage(jobs, since=time.time() - days * 86400)


@router.get(
    "/target/heads",
    response_class=Response,
    responses=_binary(
        SAFETENSORS,
        "safetensors: embed_tokens.weight and lm_head.weight, both [V, H], and norm.weight [H] when the final "
        "norm is an RMSNorm the cache serves, with metadata final_norm_eps and final_norm_kind: rmsnorm "
        "(weight * x / rms(x)) or rmsnorm_zero_centered ((1 + weight) * x / rms(x)); absent means rmsnorm",
    ),
)
async def target_heads(tensors: TensorsDep) -> Response:
    """The target's input embedding and output head, which DFlash drafters borrow (and its final norm)."""
    return Response(content=await run_in_threadpool(lambda: tensors.heads), media_type=SAFETENSORS)


@router.get("/metrics", response_class=Response, responses=_binary(PROMETHEUS, "Prometheus text exposition"))
def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics: prompts computed and failed, /hidden requests and bytes, compute time."""
    return Response(content=service.metrics.render(), media_type=PROMETHEUS)
