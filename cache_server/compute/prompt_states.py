"""What `GET /prompts`, `/prompts/{id}`, `/sets` and jobs' `"all"` report: each registered prompt's
status (ready once published, failed once the target failed on it, else pending), from the store and
the shared capture table, so that every server on a store gives the same answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal, NamedTuple

from cache_server.compute.registry import Registration, Registry
from cache_server.compute.sets import SetRegistry
from cache_server.coordination.captures import CaptureQueue, CaptureState
from cache_server.errors import PromptNotFound, UnknownSets
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.manifest import PromptManifest
from schemas.loss_mask import Spans
from schemas.prompts import PromptPage, PromptState, PromptStatus, SetCounts, SetList
from schemas.sampling import GREEDY

PendingPhase = Literal["queued", "generating", "capturing"]


class PromptStates:
    """Status reads over one namespace's registrations, sets, store and capture work."""

    def __init__(self, store: HiddenStore, registry: Registry, sets: SetRegistry, captures: CaptureQueue) -> None:
        self.store, self.registry, self.sets, self.captures = store, registry, sets, captures

    def status(self, prompt_id: str, captures: dict[str, CaptureState] | None = None) -> PromptStatus:
        """A prompt's status; `captures` is `CaptureQueue.states()` when asking about many prompts."""
        if self.store.manifest(prompt_id) is not None:
            return PromptStatus.ready
        state = captures.get(prompt_id) if captures is not None else self.captures.state(prompt_id)
        if state is not None and state.published:  # by another server: read its manifest once
            return PromptStatus.ready if self.store.manifest(prompt_id, fresh=True) else PromptStatus.pending
        if state is not None and state.status == "failed":
            return PromptStatus.failed
        return PromptStatus.pending

    def state(
        self,
        prompt_id: str,
        *,
        with_tokens: bool = True,
        captures: dict[str, CaptureState] | None = None,
        memberships: dict[str, list[str]] | None = None,
    ) -> PromptState:
        """A prompt's status; listings leave out token_ids (a store read per prompt) and pass in the
        capture states and set memberships of all prompts, read once."""
        reg = self.registered(prompt_id)
        if captures is None:  # one prompt: its capture state alone, read once for status and error
            capture = self.captures.state(prompt_id)
            captures = {prompt_id: capture} if capture is not None else {}
        capture = captures.get(prompt_id)
        status = self.status(prompt_id, captures)
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
            status=status,
            prompt_len=reg.prompt_len,
            num_tokens=num_tokens,
            token_ids=tokens,
            layers_stored=list(manifest.layers) if manifest else [],
            sets=memberships.get(prompt_id, []) if memberships is not None else self.sets.of(prompt_id),
            chat_template_sha256=reg.chat_template_sha256,
            enable_thinking=reg.enable_thinking,
            greedy_mismatches=manifest.greedy_mismatches if manifest else None,
            generator=manifest.generator if manifest else None,
            sampling=reg.sampling,
            outside_support=manifest.outside_support if manifest else None,
            loss_spans=_listed(manifest.loss_spans if manifest else reg.stored_loss_spans(num_tokens)),
            error=capture.error if capture is not None and capture.status == "failed" else None,
        )

    def page(
        self, offset: int, limit: int, status: PromptStatus | None = None, set_name: str | None = None
    ) -> PromptPage:
        """One page of the registered prompts, optionally of one status and of one set."""
        regs = self.registry.all()
        captures = self.captures.states()
        if set_name is not None:
            regs = [r for p in self.set_members(set_name) if (r := self.registry.get(p)) is not None]
        if status is not None:
            regs = [r for r in regs if self.status(r.prompt_id, captures) == status]
        memberships = self.sets.memberships()
        states = [
            self.state(r.prompt_id, with_tokens=False, captures=captures, memberships=memberships)
            for r in regs[offset : offset + limit]
        ]
        return PromptPage(prompts=states, total=len(regs), offset=offset, limit=limit)

    def evaluable_prompt_ids(self, sets: Sequence[str] = ()) -> list[str]:
        """What a job's `prompts: "all"` means: every registered prompt (of `sets`, when given) the target
        has not failed on (as `eval-worker evaluate --all-prompts` / `--set` take them)."""
        failed = {p for p, state in self.captures.states().items() if state.status == "failed"}
        ids = (
            list(dict.fromkeys(p for name in sets for p in self.set_members(name)))
            if sets
            else [r.prompt_id for r in self.registry.all()]
        )
        return [p for p in ids if p not in failed]

    def pending_count(self) -> int:
        """Registered prompts neither ready nor failed."""
        captures = self.captures.states()
        return sum(self.status(r.prompt_id, captures) == PromptStatus.pending for r in self.registry.all())

    def set_counts(self) -> SetList:
        """`GET /sets`: every set with its prompts counted by status and by sampling setting, and how far
        its ready prompts' responses are from the target (greedy ones: tokens not its argmax; sampled
        ones: tokens outside the support of their setting) - the agreement of the engine that made them;
        the same for the prompts in no set and for all of them. Each prompt is looked up once, however
        many groups count it: a pending one's manifest is a store read each time it is asked for."""
        captures = self.captures.states()
        facts: dict[str, _PromptFacts] = {}

        def counted(name: str, members: Sequence[str]) -> SetCounts:
            for p in members:
                if p not in facts:
                    facts[p] = self._facts(p, captures)
            return _counts(name, [facts[p] for p in members])

        everything = [r.prompt_id for r in self.registry.all()]
        memberships = self.sets.memberships()
        return SetList(
            sets=[counted(name, self.set_members(name)) for name in self.sets.names()],
            no_set=counted("", [p for p in everything if not memberships.get(p)]),
            all_prompts=counted("", everything),
        )

    def _facts(self, prompt_id: str, captures: dict[str, CaptureState]) -> _PromptFacts:
        status = self.status(prompt_id, captures)
        reg = self.registry.get(prompt_id)
        return _PromptFacts(
            status=status,
            phase=self._phase(prompt_id, captures) if status == PromptStatus.pending else None,
            manifest=self.store.manifest(prompt_id) if status == PromptStatus.ready else None,
            setting=(reg.sampling or GREEDY).setting if reg is not None else None,
        )

    def _phase(self, prompt_id: str, captures: dict[str, CaptureState]) -> PendingPhase:
        """Where a pending prompt is: not taken up yet, its response being made (a server generates
        it, then captures the prompt), or captured with its tokens known."""
        state = captures.get(prompt_id)
        if state is None or state.status != "running":
            return "queued"
        reg = self.registry.get(prompt_id)
        to_generate = reg is not None and reg.response_ids is None and reg.max_new_tokens is not None
        return "generating" if to_generate else "capturing"

    def settings(self, prompts: Literal["all"] | Sequence[str], sets: Sequence[str]) -> set[str]:
        """The sampling settings of the responses a job selects (its prompt ids, or all / its sets' prompts)."""
        if prompts == "all":
            ids = [p for name in sets for p in self.set_members(name)] if sets else None
        else:
            ids = list(prompts)
        regs = self.registry.all() if ids is None else [r for p in ids if (r := self.registry.get(p)) is not None]
        return {(r.sampling or GREEDY).setting for r in regs}

    def set_members(self, name: str) -> list[str]:
        """A set's prompt ids; UnknownSets if there is no such set."""
        members = self.sets.members(name)
        if members is None:
            raise UnknownSets(f"no prompt set {name!r}; GET /sets lists them")
        return members

    def registered(self, prompt_id: str) -> Registration:
        """A registration; PromptNotFound if there is none."""
        reg = self.registry.get(prompt_id)
        if reg is None:
            raise PromptNotFound(f"no prompt {prompt_id!r} is registered for target {self.store.fingerprint}")
        return reg


def _listed(spans: Spans | None) -> list[tuple[int, int]] | None:
    return list(spans) if spans is not None else None


class _PromptFacts(NamedTuple):
    """What `GET /sets` counts of one prompt."""

    status: PromptStatus
    phase: PendingPhase | None  # where a pending prompt is
    manifest: PromptManifest | None  # a ready prompt's
    setting: str | None  # its response's sampling setting (None: not registered)


def _counts(name: str, prompts: Sequence[_PromptFacts]) -> SetCounts:
    statuses = Counter(p.status for p in prompts)
    phases = Counter(p.phase for p in prompts if p.phase is not None)
    mismatches = [p.manifest.greedy_mismatches or 0 for p in prompts if p.manifest is not None]
    outside = [p.manifest.outside_support or 0 for p in prompts if p.manifest is not None]
    return SetCounts(
        name=name,
        total=sum(statuses.values()),
        pending=statuses[PromptStatus.pending],
        ready=statuses[PromptStatus.ready],
        failed=statuses[PromptStatus.failed],
        queued=phases["queued"],
        generating=phases["generating"],
        capturing=phases["capturing"],
        greedy_mismatches=sum(mismatches),
        prompts_not_greedy=sum(map(bool, mismatches)),
        outside_support=sum(outside),
        prompts_outside_support=sum(map(bool, outside)),
        settings=dict(Counter(p.setting for p in prompts if p.setting is not None)),
    )
