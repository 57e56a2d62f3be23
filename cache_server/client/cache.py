"""`CacheClient`: the cache server's prompts, models and tensor endpoints over HTTP.

JSON goes through httpx; tensor bodies through `http.client` straight into one buffer
(`bodies.py`). Server errors come back as the typed exceptions of `errors.py`.
"""

from __future__ import annotations

import http.client
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Literal

import httpx
import numpy as np

from cache_server.client.body_reader import BodyReader, BodyTruncated, Scratch, httpx_body
from cache_server.client.errors import ProtocolError, ServerUnreachable, raise_for_error
from cache_server.client.pieces import OutMismatch, PiecesCorrupt, check_out, decode_pieces
from cache_server.client.results import HiddenResult, TargetHeads
from cache_server.client.waiting import wait_ready
from schemas.hidden import HIDDEN_TENSOR, TOKEN_IDS_TENSOR, FinalNormMode, HiddenMetadata
from schemas.layers import LAYER_CONVENTION, RequestLayerConvention, format_layer_list
from schemas.model import ModelInfo
from schemas.pieces import MEDIA_TYPE as PIECES_MEDIA_TYPE
from schemas.plan import StoragePlan
from schemas.prompts import (
    GenerateSpec,
    PromptSpec,
    PromptState,
    PromptStatus,
    RegisteredPrompt,
    RegisterRequest,
    RegisterResponse,
    SetList,
)
from schemas.safetensors_frame import WireFormatError, parse

log = logging.getLogger(__name__)


class CacheClient:
    """Synchronous client of a cache server; use as a context manager or call close().

    `feature_servers`: more servers on the same store (and target), over which `hidden` spreads its
    requests in turn with `base_url`'s; everything else goes to `base_url`."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
        feature_servers: Sequence[str] = (),
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers)
        # Tensor bodies skip httpx, unless a transport is passed in (tests): then everything uses it.
        self._bodies = BodyReader(self.base_url, timeout=timeout, headers=headers) if transport is None else None
        if feature_servers and transport is not None:
            raise ValueError("feature_servers need real connections, not a transport")
        self._spread = [self._bodies, *(BodyReader(u, timeout=timeout, headers=headers) for u in feature_servers)]
        self._turn = itertools.count()  # next() is atomic: threads take turns without a lock
        self._spread_checked = not feature_servers
        self._scratch = Scratch()  # receive buffers of bodies decoded into an array of their own

    def __enter__(self) -> CacheClient:
        return self

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pools."""
        self._http.close()
        for bodies in self._spread:
            if bodies is not None:
                bodies.close()

    def _unreachable(self, e: Exception, url: str | None = None) -> ServerUnreachable:
        return ServerUnreachable(f"cannot reach the cache server at {url or self.base_url}: {e}")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One JSON request; raises the typed error of an error response."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise self._unreachable(e) from e
        raise_for_error(response)
        return response

    # -- JSON endpoints -------------------------------------------------------------------------

    def model(self) -> ModelInfo:
        """What the server serves: the target, its shape, dtype and captured layers."""
        return ModelInfo.model_validate(self.request("GET", "/model").json())

    def register(
        self,
        prompts: Iterable[PromptSpec | dict[str, Any]],
        *,
        max_new_tokens: int | None = None,
        generate: GenerateSpec | None = None,
    ) -> list[RegisteredPrompt]:
        """Register prompts with generated responses of up to `max_new_tokens` (greedy), or as `generate`
        says (sampled, several samples each); returns their ids, every sample of a prompt in turn."""
        body = _register_body(prompts, max_new_tokens, generate)
        return RegisterResponse.model_validate(self.request("POST", "/prompts", json=body).json()).prompts

    def plan(
        self,
        prompts: Iterable[PromptSpec | dict[str, Any]],
        *,
        max_new_tokens: int | None = None,
        generate: GenerateSpec | None = None,
    ) -> StoragePlan:
        """What registering these prompts would store, without registering them (`POST /plan`)."""
        body = _register_body(prompts, max_new_tokens, generate)
        return StoragePlan.model_validate(self.request("POST", "/plan", json=body).json())

    def prompt(self, prompt_id: str) -> PromptState:
        """One prompt's status, with its token ids."""
        return PromptState.model_validate(self.request("GET", f"/prompts/{prompt_id}").json())

    def paged(
        self,
        path: str,
        key: str,
        status: str | None = None,
        page_size: int = 1000,
        filters: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Every item of a paged listing (`{key: [...], total, offset, limit}`), optionally filtered by status
        (and by the listing's other filters, e.g. `set`)."""
        out: list[dict[str, Any]] = []
        while True:
            params: dict[str, Any] = {"offset": len(out), "limit": page_size, **(filters or {})}
            if status is not None:
                params["status"] = status
            page = self.request("GET", path, params=params).json()
            out.extend(page[key])
            if not page[key] or len(out) >= page["total"]:
                return out

    def prompts(self, status: PromptStatus | None = None, *, set_name: str | None = None) -> list[PromptState]:
        """Every registered prompt (of one set, when given), paging through `GET /prompts`."""
        filters = {"set": set_name} if set_name is not None else {}
        items = self.paged("/prompts", "prompts", status.value if status else None, filters=filters)
        return [PromptState.model_validate(p) for p in items]

    def sets(self) -> SetList:
        """Every prompt set with its prompts counted by status (`GET /sets`)."""
        return SetList.model_validate(self.request("GET", "/sets").json())

    def wait_ready(
        self,
        prompt_ids: Sequence[str],
        *,
        timeout_s: float = 600.0,
        poll_s: float = 0.2,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Poll until every prompt is ready; PromptFailedError on a failure, TimeoutError past the bound.
        `progress(ready, total)` is called after every poll (e.g. to drive a progress bar).

        A few prompts are polled one by one; many through the paged listing (1000 per request)."""
        wait_ready(self, prompt_ids, timeout_s=timeout_s, poll_s=poll_s, progress=progress)

    # -- tensor endpoints -----------------------------------------------------------------------

    def get_body(
        self, path: str, params: dict[str, Any] | None = None, *, scratch: bool = False, spread: bool = False
    ) -> tuple[np.ndarray | bytes, str]:
        """A binary body (`GET path`) in one buffer preallocated from Content-Length (no growing copies),
        and its content type: how `hidden` and `heads` read theirs, for any route that sends one.
        `scratch`: into this thread's reused buffer, valid until its next scratch read. `spread`: from
        the next of the feature servers in turn."""
        reader = self._spread[next(self._turn) % len(self._spread)] if spread else self._bodies
        if reader is None:
            try:
                return httpx_body(self._http, path, params)
            except httpx.TransportError as e:
                raise self._unreachable(e) from e
        try:
            body = reader.get(path, params, into=self._scratch if scratch else None)
        except BodyTruncated as e:
            raise ProtocolError(str(e)) from e
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(e, reader.base_url) from e
        if isinstance(body.data, bytes):
            raise_for_error(httpx.Response(body.status, headers=body.headers, content=body.data))
        content_type = next((v for k, v in body.headers if k.lower() == "content-type"), "")
        return body.data, content_type

    def hidden(
        self,
        prompt_id: str,
        layers: Sequence[int],
        *,
        start: int | None = None,
        stop: int | None = None,
        encoding: Literal["pieces", "safetensors"] | None = None,
        out: np.ndarray | None = None,
        layer_convention: RequestLayerConvention = LAYER_CONVENTION,
        final_norm: FinalNormMode = "raw",
    ) -> HiddenResult:
        """Hidden states of `layers` (in this order, numbered in `layer_convention`) concatenated per token,
        with the token ids (numpy).

        By default the server sends the stored compressed pieces and they are decoded here, on this
        machine's cores; `encoding="safetensors"` asks for the decoded body. The array is the same.
        `final_norm="post"` has the server apply the target's final norm to its last layer (which
        `layers` must name); such a body is always safetensors.
        `out` (C-contiguous, [rows, len(layers) * H], the served dtype) receives the hidden states
        instead of a new array: reusing one saves the page faults of fresh memory on every call."""
        self._check_spread()
        encoding = encoding or ("safetensors" if final_norm == "post" else "pieces")
        params: dict[str, Any] = {"prompt_id": prompt_id, "layers": format_layer_list(layers), "encoding": encoding}
        if layer_convention != LAYER_CONVENTION:
            params["layer_convention"] = layer_convention
        if final_norm != "raw":
            params["final_norm"] = final_norm
        if start is not None:
            params["start"] = start
        if stop is not None:
            params["stop"] = stop
        try:
            try:
                hidden, token_ids, meta = self._hidden_body(params, out)
            except PiecesCorrupt as e:  # damaged after the server checked it (a second time: ProtocolError)
                log.warning("/hidden for %s: %s; asking again", prompt_id, e)
                hidden, token_ids, meta = self._hidden_body(params, out)
            metadata = HiddenMetadata.from_strings(meta)
            result = HiddenResult(hidden, token_ids, metadata)
        except OutMismatch:
            raise
        except (WireFormatError, KeyError, ValueError, TypeError) as e:
            raise ProtocolError(f"malformed /hidden body for {prompt_id}: {e}") from e
        if metadata.layers != list(layers) or result.hidden.shape[1] != len(layers) * metadata.hidden_size:
            raise ProtocolError(
                f"asked for layers {list(layers)}, got {metadata.layers} with width {result.hidden.shape[1]}"
            )
        return result

    def _hidden_body(
        self, params: dict[str, Any], out: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
        """One `/hidden` body: (hidden, token ids, metadata strings)."""
        # The body lands in this thread's reused buffer and is decoded or copied out of it: faulting
        # fresh pages inside the socket read costs more than the copy (bench/serve_hidden.py).
        data, content_type = self.get_body("/hidden", params, scratch=True, spread=True)
        if content_type.startswith(PIECES_MEDIA_TYPE):
            return decode_pieces(data, out)
        tensors, meta = parse(data)
        return _copied(tensors[HIDDEN_TENSOR], out), tensors[TOKEN_IDS_TENSOR].copy(), meta

    def _check_spread(self) -> None:
        """Once: every feature server must serve the target `base_url` serves (ProtocolError if not)."""
        if self._spread_checked:
            return
        want = self.model().fingerprint
        for url in [r.base_url for r in self._spread[1:] if r is not None]:
            try:  # through this client's pool: its token and timeout; a server that is down is unreachable
                response = self._http.get(f"{url}/model")
            except httpx.TransportError as e:
                raise self._unreachable(e, url) from e
            raise_for_error(response)
            got = ModelInfo.model_validate(response.json()).fingerprint
            if got != want:
                raise ProtocolError(f"{url} serves target {got}, {self.base_url} serves {want}")
        self._spread_checked = True

    def heads(self) -> TargetHeads:
        """The target's embed_tokens and lm_head (what a DFlash drafter borrows), as numpy arrays."""
        try:
            return TargetHeads.from_body(*parse(self.get_body("/target/heads")[0]))
        except (WireFormatError, KeyError) as e:
            raise ProtocolError(f"malformed /target/heads body: {e}") from e


def _register_body(
    prompts: Iterable[PromptSpec | dict[str, Any]], max_new_tokens: int | None, generate: GenerateSpec | None
) -> dict[str, Any]:
    specs = [p if isinstance(p, PromptSpec) else PromptSpec.model_validate(p) for p in prompts]
    if generate is not None and max_new_tokens is not None:
        raise ValueError("give max_new_tokens or generate, not both")
    if generate is None and max_new_tokens:
        generate = GenerateSpec(max_new_tokens=max_new_tokens)
    return RegisterRequest(prompts=specs, generate=generate).model_dump(mode="json", exclude_none=True)


def _copied(hidden: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """`hidden` copied into `out` (checked), or into a new array."""
    if out is None:
        return hidden.copy()
    check_out(out, hidden.shape, hidden.dtype)
    np.copyto(out, hidden)
    return out
