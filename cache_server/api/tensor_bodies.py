"""The tensor bodies of `GET /hidden` and `GET /target/heads`, built next to the routes that send
them: a published prompt's rows as one safetensors buffer (`bodies.py`), as a stream of decoded
blocks (`streaming.py`), or as the stored pieces (`pieces_body.py`). Bytes that do not decode are
never sent: the service (`HiddenStateService.hidden`) captures their layers again and the caller gets
its typed error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Literal

from fastapi import Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from cache_server.api.bodies import PostNorm, heads_body, hidden_body
from cache_server.api.pieces_body import pieces_body
from cache_server.api.streaming import BlockBuffers, hidden_stream
from cache_server.capture.target import Target
from cache_server.errors import InvalidLayers
from cache_server.store.errors import StoreCorrupt
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.hidden import LayerRequest
from schemas.pieces import ENCODING, MEDIA_TYPE

SAFETENSORS = "application/octet-stream"


class TensorBodies:
    """Builds `/hidden` and `/target/heads` bodies from a store and a target; `stream`: send `/hidden`
    safetensors bodies block by block while the next block decodes. `recapture` is the service's: a
    block that fails its checksums mid-stream still has its layers captured again."""

    def __init__(
        self,
        store: HiddenStore,
        target: Target,
        recapture: Callable[[str, StoreCorrupt], Exception],
        *,
        stream: bool,
    ) -> None:
        self.store, self.target, self._recapture, self.stream = store, target, recapture, stream
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hidden-stream")
        self._buffers = BlockBuffers()

    def close(self) -> None:
        """Stop the stream's decoding thread."""
        self._pool.shutdown(wait=True)

    def hidden(
        self, layers: Sequence[int], encoding: Literal["safetensors", "pieces"], asked: LayerRequest | None = None
    ) -> Callable[[PromptManifest, int, int], Awaitable[tuple[int, Response]]]:
        """What sends rows start:stop of `layers` of a published prompt, concatenated per token in that
        order (for `HiddenStateService.hidden`, which owns waiting and recovery); the metadata names
        them as `asked` did. InvalidLayers, before any wait, for a `final_norm=post` it cannot serve."""
        post_norm = self._post_norm(layers, encoding) if asked is not None and asked.final_norm == "post" else None

        async def send(manifest: PromptManifest, start: int, stop: int) -> tuple[int, Response]:
            store, pid = self.store, manifest.prompt_id
            if encoding == ENCODING:
                pieces = await run_in_threadpool(pieces_body, store, manifest, layers, start, stop, asked)
                return pieces.nbytes, _streamed(_parts(pieces.parts), pieces.nbytes, MEDIA_TYPE)
            if self.stream and post_norm is None:  # a normed body is built whole
                stream = await hidden_stream(store, manifest, layers, start, stop, self._pool, self._buffers, asked)
                return stream.nbytes, _streamed(self._guarded(pid, stream.pieces), stream.nbytes)
            body = await run_in_threadpool(hidden_body, store, manifest, layers, start, stop, asked, post_norm)
            return body.buffer.nbytes, Response(body.as_memoryview(), media_type=SAFETENSORS)

        return send

    def _post_norm(self, layers: Sequence[int], encoding: str) -> PostNorm:
        """The target's final norm for its last layer in `layers`, or InvalidLayers saying why not."""
        last, norm = self.target.info.num_layers - 1, self.target.heads.final_norm
        if last not in layers:
            raise InvalidLayers(
                f"final_norm=post applies to the target's last layer, {last} (0-based decoder outputs), "
                "which layers does not name"
            )
        if norm is None:
            raise InvalidLayers("final_norm=post: the target's final norm is not an RMSNorm the cache computes")
        if encoding == ENCODING:
            raise InvalidLayers("final_norm=post is computed by the server: ask encoding=safetensors, not pieces")
        return PostNorm(norm, last)

    @cached_property
    def heads(self) -> bytes:
        """`GET /target/heads`, serialised once: the heads never change while the target is loaded."""
        return heads_body(self.target)

    async def _guarded(
        self, prompt_id: str, pieces: AsyncIterator[bytes | memoryview]
    ) -> AsyncIterator[bytes | memoryview]:
        """`pieces`; a later block that does not decode still has its layers captured again (the
        client sees the connection end before Content-Length, never wrong bytes)."""
        try:
            async for piece in pieces:
                yield piece
        except StoreCorrupt as e:
            await run_in_threadpool(self._recapture, prompt_id, e)
            raise


def _streamed(parts: AsyncIterator[bytes | memoryview], nbytes: int, media_type: str = SAFETENSORS) -> Response:
    return StreamingResponse(parts, media_type=media_type, headers={"Content-Length": str(nbytes)})


async def _parts(parts: list[memoryview | bytes]) -> AsyncIterator[memoryview | bytes]:
    """A body already in memory, sent as its parts (no joined copy)."""
    for part in parts:
        yield part
