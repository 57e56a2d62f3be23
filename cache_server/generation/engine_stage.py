"""Generations in flight on a serving engine, so that it batches them while the target captures the
prompts already answered: each request retried with backoff while the engine is away, a refused
one failing its prompt alone."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from cache_server.generation.engine import EngineClient, EngineRefused, EngineUnavailable
from schemas.sampling import SamplingParams

log = logging.getLogger(__name__)

_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0


class EngineStage:
    """Runs `EngineClient.generate` for submitted prompts on a loop thread of its own.

    `answered(key, tokens)` and `refused(key, error)` are called from that thread, once per
    submission, unless the stage is closed first (then the work is simply dropped: its prompt is
    still queued in the database, and redone)."""

    def __init__(
        self,
        client: EngineClient,
        *,
        answered: Callable[[str, list[int]], None],
        refused: Callable[[str, Exception], None],
        on_error: Callable[[], None],
    ) -> None:
        self.client = client
        self._answered, self._refused, self._on_error = answered, refused, on_error
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-generation", daemon=True)
        self._thread.start()

    def submit(
        self, key: str, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None
    ) -> None:
        """Generate a response for `prompt_ids` (a prompt id as `key`), greedy or sampled at `sampling`."""
        asyncio.run_coroutine_threadsafe(self._run(key, prompt_ids, max_tokens, sampling), self._loop)

    def close(self) -> None:
        """Cancel what is in flight and stop the loop thread."""
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _cancel_all(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.aclose()

    async def _run(self, key: str, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None) -> None:
        try:
            tokens = await self._with_retries(key, prompt_ids, max_tokens, sampling)
        except EngineRefused as e:
            await asyncio.to_thread(self._refused, key, e)  # both may write the database: off the loop
        else:
            await asyncio.to_thread(self._answered, key, tokens)

    async def _with_retries(
        self, key: str, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None
    ) -> list[int]:
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                return await self.client.generate(prompt_ids, max_tokens, sampling)
            except EngineUnavailable as e:
                self._on_error()
                url = self.client.engine.url
                log.warning("engine %s unavailable for prompt %s, retrying in %.1f s: %s", url, key, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
