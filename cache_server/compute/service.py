"""`HiddenStateService`, what the HTTP routes call: register prompts, report their status, and
hand out stored layers, computing a missing one at most once (through the `Scheduler`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property

from cache_server.capture.target import Target
from cache_server.compute.bodies import heads_body, hidden_body, hidden_metadata
from cache_server.compute.metrics import Metrics
from cache_server.compute.pieces_body import PiecesBody, pieces_body
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.compute.scheduler import Scheduler
from cache_server.compute.sets import SetRegistry
from cache_server.compute.streaming import BlockBuffers, HiddenStream, hidden_stream
from cache_server.errors import InvalidLayers, InvalidPrompt, PromptNotFound, PromptNotReady, UnknownSets
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from cache_server.torch_utils import dtype_name
from schemas.layers import layer_list_problem, parse_layer_list
from schemas.model import ModelInfo
from schemas.prompts import (
    ChatMessage,
    GenerateSpec,
    PromptPage,
    PromptSpec,
    PromptState,
    PromptStatus,
    RegisteredPrompt,
    SetCounts,
    SetList,
)
from schemas.safetensors_frame import FramedBody


class HiddenStateService:
    """One target, its store and its scheduler: prompts in, stored layer sets out."""

    def __init__(
        self,
        target: Target,
        store: HiddenStore,
        *,
        capture_layers: Sequence[int],
        metrics: Metrics,
        batch_tokens: int = 8192,
        wait_s: float = 30.0,
        stream_hidden: bool = True,
    ) -> None:
        self.target = target
        self.store = store
        self.metrics = metrics
        self.registry = Registry(store.namespace / "requests")
        self.sets = SetRegistry(store.namespace / "sets")
        metrics.watch_pending(self.pending_count)
        self.scheduler = Scheduler(target, store, metrics, capture_layers=capture_layers, batch_tokens=batch_tokens)
        self._wait_s = wait_s
        self.stream_hidden = stream_hidden
        # Row blocks of streamed bodies decode here, in order, each over all the store's read threads.
        self._stream_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hidden-stream")
        self._buffers = BlockBuffers()

    @property
    def capture_layers(self) -> list[int]:
        """The layers stored for every prompt (others are computed when first asked for)."""
        return self.scheduler.capture_layers

    def start(self) -> None:
        """Start computing, first re-queuing whatever was registered but never published."""
        self.scheduler.start()
        for reg in self.registry.all():
            if self.store.manifest(reg.prompt_id) is None:
                self.scheduler.schedule(reg, self.capture_layers)

    def close(self) -> None:
        """Finish the batch in hand and stop; queued prompts stay registered and resume on restart."""
        self.scheduler.close()
        self._stream_pool.shutdown(wait=True)
        self.store.close()

    def model_info(self) -> ModelInfo:
        """`GET /model`."""
        info = self.target.info
        return ModelInfo(
            name=info.name,
            fingerprint=info.fingerprint,
            num_layers=info.num_layers,
            hidden_size=info.hidden_size,
            vocab_size=info.vocab_size,
            max_position_embeddings=info.max_position_embeddings,
            dtype=dtype_name(info.dtype),
            capture_layers=self.capture_layers,
            chat_template_sha256=self.target.chat_template_sha256,
        )

    # -- registration ---------------------------------------------------------------------------

    def register(self, specs: Sequence[PromptSpec], generate: GenerateSpec | None) -> list[RegisteredPrompt]:
        """Validate every prompt first (all or nothing), then queue the new ones (and failed ones again)."""
        regs = [self._registration(spec, generate) for spec in specs]
        out = []
        for reg in regs:
            retry = self.scheduler.forget_failure(reg.prompt_id)
            if self.registry.add(reg) or retry:
                self.scheduler.schedule(reg, self.capture_layers)
            out.append(RegisteredPrompt(prompt_id=reg.prompt_id, status=self._status(reg.prompt_id)))
        for name in dict.fromkeys(n for spec in specs for n in spec.sets):
            self.sets.add(name, [r.prompt_id for r, spec in zip(regs, specs, strict=True) if name in spec.sets])
        return out

    def _registration(self, spec: PromptSpec, generate: GenerateSpec | None) -> Registration:
        prompt_ids = tuple(self.target.encode(self._answers_filled_in(spec)))
        response = tuple(spec.response_token_ids) if spec.response_token_ids is not None else None
        max_new = generate.max_new_tokens if generate is not None and response is None else None
        self.target.check_length(len(prompt_ids) + (len(response) if response else max_new or 0))
        return Registration(
            prompt_id=prompt_id_for(prompt_ids, response, max_new),
            prompt_ids=prompt_ids,
            response_ids=response,
            max_new_tokens=max_new,
            name=spec.name,
            chat_template_sha256=self.target.chat_template_sha256 if spec.messages is not None else None,
            enable_thinking=spec.enable_thinking,
        )

    def _answers_filled_in(self, spec: PromptSpec) -> PromptSpec:
        """`spec` with every `response_of` message replaced by that prompt's response, decoded."""
        if not spec.messages or all(m.response_of is None for m in spec.messages):
            return spec
        messages = []
        for m in spec.messages:
            if m.response_of is not None:
                reg, manifest = self.registry.get(m.response_of), self.store.manifest(m.response_of)
                if reg is None:
                    raise InvalidPrompt(f"response_of {m.response_of!r}: no such prompt is registered")
                if manifest is None:
                    raise InvalidPrompt(f"response_of {m.response_of!r}: that prompt's response is not computed yet "
                                        "(wait until it is ready, then register the next turn)")  # fmt: skip
                response = self.store.token_ids(m.response_of)[reg.prompt_len :].tolist()
                m = ChatMessage(role="assistant", content=self.target.decode(response))
            messages.append(m)
        return spec.model_copy(update={"messages": messages})

    def is_registered(self, prompt_id: str) -> bool:
        """Whether a prompt with this id is registered for the target."""
        return self.registry.get(prompt_id) is not None

    # -- status ---------------------------------------------------------------------------------

    def _status(self, prompt_id: str) -> PromptStatus:
        if self.store.manifest(prompt_id) is not None:
            return PromptStatus.ready
        return PromptStatus.failed if self.scheduler.failure(prompt_id) is not None else PromptStatus.pending

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
        return PromptState(
            prompt_id=prompt_id,
            name=reg.name,
            status=self._status(prompt_id),
            prompt_len=reg.prompt_len,
            num_tokens=num_tokens,
            token_ids=tokens,
            layers_stored=list(manifest.layers) if manifest else [],
            sets=self.sets.of(prompt_id),
            chat_template_sha256=reg.chat_template_sha256,
            enable_thinking=reg.enable_thinking,
            greedy_mismatches=manifest.greedy_mismatches if manifest else None,
            error=self.scheduler.failure(prompt_id),
        )

    def page(
        self, offset: int, limit: int, status: PromptStatus | None = None, set_name: str | None = None
    ) -> PromptPage:
        """One page of the registered prompts, optionally of one status and of one set."""
        regs = self.registry.all()
        if set_name is not None:
            regs = [r for p in self._set_members(set_name) if (r := self.registry.get(p)) is not None]
        if status is not None:
            regs = [r for r in regs if self._status(r.prompt_id) == status]
        states = [self.state(r.prompt_id, with_tokens=False) for r in regs[offset : offset + limit]]
        return PromptPage(prompts=states, total=len(regs), offset=offset, limit=limit)

    def evaluable_prompt_ids(self, sets: Sequence[str] = ()) -> list[str]:
        """What a job's `prompts: "all"` means: every registered prompt (of `sets`, when given) the target
        has not failed on (as `eval-worker evaluate --all-prompts` / `--set` take them)."""
        failed = self.scheduler.failed_ids()
        ids = (
            list(dict.fromkeys(p for name in sets for p in self._set_members(name)))
            if sets
            else [r.prompt_id for r in self.registry.all()]
        )
        return [p for p in ids if p not in failed]

    def pending_count(self) -> int:
        """Registered prompts neither ready nor failed."""
        return sum(self._status(r.prompt_id) == PromptStatus.pending for r in self.registry.all())

    def set_counts(self) -> SetList:
        """`GET /sets`: every set with its prompts counted by status."""
        out = []
        for name in self.sets.names():
            statuses = Counter(self._status(p) for p in self._set_members(name))
            out.append(SetCounts(name=name, total=sum(statuses.values()), pending=statuses[PromptStatus.pending],
                                 ready=statuses[PromptStatus.ready], failed=statuses[PromptStatus.failed]))  # fmt: skip
        return SetList(sets=out)

    def _set_members(self, name: str) -> list[str]:
        members = self.sets.members(name)
        if members is None:
            raise UnknownSets(f"no prompt set {name!r}; GET /sets lists them")
        return members

    def _registered(self, prompt_id: str) -> Registration:
        reg = self.registry.get(prompt_id)
        if reg is None:
            raise PromptNotFound(f"no prompt {prompt_id!r} is registered for target {self.target.info.fingerprint}")
        return reg

    # -- layers ---------------------------------------------------------------------------------

    def layer_ids(self, text: str) -> list[int]:
        """A `layers=` parameter as distinct layer ids of the target; InvalidLayers naming the valid range."""
        try:
            layers = parse_layer_list(text)
        except ValueError as e:
            raise InvalidLayers(f"{e}; valid layer ids are 0..{self.target.info.num_layers - 1}") from None
        problem = layer_list_problem(layers, self.target.info.num_layers)
        if problem is not None:
            raise InvalidLayers(problem)
        return layers

    async def ensure(self, prompt_id: str, layers: Sequence[int]) -> PromptManifest:
        """The published manifest once it holds `layers`, computing them at most once."""
        reg = self._registered(prompt_id)
        deadline = time.monotonic() + self._wait_s
        while True:
            manifest = self.store.manifest(prompt_id)
            if manifest is not None and set(layers) <= set(manifest.layers):
                return manifest
            task = self.scheduler.schedule(reg, layers)
            remaining = deadline - time.monotonic()
            try:
                # shield: a waiter timing out must not cancel the shared computation.
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(task.future)), max(remaining, 0.0))
            except TimeoutError:
                raise PromptNotReady(
                    f"prompt {prompt_id} is still being computed after {self._wait_s:.0f} s", retry_after_s=5
                ) from None

    def hidden_body(self, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int) -> FramedBody:
        """The `GET /hidden` body of a published prompt in one buffer (blocking: run it off the loop)."""
        body = hidden_body(self.store, manifest, layers, start, stop)
        self._count(body.buffer.nbytes)
        return body

    async def hidden_stream(
        self, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int
    ) -> HiddenStream:
        """The `GET /hidden` body of a published prompt as a stream of decoded row blocks."""
        metadata = hidden_metadata(manifest, layers, start, stop).to_strings()
        stream = await hidden_stream(
            self.store, manifest, layers, start, stop, metadata, self._stream_pool, self._buffers
        )
        self._count(stream.nbytes)
        return stream

    def pieces_body(self, manifest: PromptManifest, layers: Sequence[int], start: int, stop: int) -> PiecesBody:
        """The `GET /hidden?encoding=pieces` body: the stored pieces, for a client that decodes them."""
        metadata = hidden_metadata(manifest, layers, start, stop).to_strings()
        body = pieces_body(self.store, manifest, layers, start, stop, metadata)
        self._count(body.nbytes)
        return body

    def _count(self, nbytes: int) -> None:
        self.metrics.hidden_requests.inc()
        self.metrics.hidden_bytes.inc(nbytes)

    @cached_property
    def heads(self) -> bytes:
        """`GET /target/heads`, serialised once: the heads never change while the target is loaded."""
        return heads_body(self.target)
