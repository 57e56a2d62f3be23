"""Registered prompts: content-addressed ids, kept in the coordination database so that every server on
a store sees every registration and pending work survives restarts.

Each server keeps a copy of the registrations (they never change: an id is its content) and catches up
with those added elsewhere by reading only the rows after the last one it saw.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from cache_server.coordination.database import Database, max_seq, rows_after
from cache_server.coordination.tables import REGISTRATIONS
from schemas.loss_mask import Spans, joined
from schemas.prompts import GeneratorInfo
from schemas.sampling import SamplingParams


class Registration(BaseModel):
    """What the target must compute for one prompt."""

    model_config = ConfigDict(frozen=True)
    prompt_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...] | None  # given by the user; None means generate (or prompt only)
    max_new_tokens: int | None
    name: str | None = None
    chat_template_sha256: str | None = None  # the template that rendered the prompt (None: none did)
    enable_thinking: bool | None = None  # what that template was given
    # How the response is (or, given, was) sampled from the target, with this sample's seed; None: greedy.
    sampling: SamplingParams | None = None
    generator: GeneratorInfo | None = None  # what made a given response, when declared (None: "given")
    # The tokens trained on, over the prompt and a given response (a generated response is trained on
    # whole, beyond these); None: the response alone, the default, which keeps the prompt's id as before.
    loss_spans: Spans | None = None

    @property
    def prompt_len(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_ids)

    @property
    def generates(self) -> bool:
        """Whether the target generates the response."""
        return self.response_ids is None and self.max_new_tokens is not None

    def stored_loss_spans(self, num_tokens: int | None) -> Spans | None:
        """The trained-on ranges its manifest keeps once `num_tokens` are known (None: the default); before
        a response is generated, the prompt's alone."""
        if self.loss_spans is None or not self.generates or num_tokens is None:
            return self.loss_spans
        return joined(self.loss_spans, ((self.prompt_len, num_tokens),))


def prompt_id_for(
    prompt_ids: tuple[int, ...],
    response_ids: tuple[int, ...] | None,
    max_new_tokens: int | None,
    sampling: SamplingParams | None = None,
    loss_spans: Spans | None = None,
) -> str:
    """Same tokens (and the same response request) -> the same id, on any server. A sampled response's
    setting and seed are part of its id (so T = 0 and T = 0.6 versions of one prompt never collide), and
    so is a loss mask other than the default; a greedy, default-masked one's id is what it was before
    either existed."""
    if response_ids is not None:
        max_new_tokens = None  # a given response makes generation settings irrelevant
    fields: dict[str, object] = {"prompt": prompt_ids, "response": response_ids, "generate": max_new_tokens}
    if sampling is not None:
        fields["sampling"] = sampling.model_dump(mode="json")
    if loss_spans is not None:
        fields["loss_spans"] = loss_spans
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:24]


class Registry:
    """Thread-safe map of prompt id -> registration for one namespace, in registration order."""

    def __init__(self, db: Database, namespace: str) -> None:
        self._db, self._ns = db, namespace
        self._lock = threading.Lock()
        self._items: dict[str, Registration] = {}
        self._seen = 0  # the last seq copied

    def add_many(self, regs: Sequence[Registration]) -> set[str]:
        """Persist registrations in one transaction; the ids that were not registered before."""
        table, wanted = REGISTRATIONS, {r.prompt_id: r for r in regs}
        with self._db.transaction(ordered=True) as c:
            mine = table.c.namespace == self._ns
            there = set(c.scalars(select(table.c.prompt_id).where(mine, table.c.prompt_id.in_(list(wanted)))))
            new = [r for pid, r in wanted.items() if pid not in there]
            seq = max_seq(c, table.c.seq, mine)
            if new:
                c.execute(
                    table.insert(),
                    [
                        {"namespace": self._ns, "prompt_id": r.prompt_id, "seq": seq + i, "body": r.model_dump_json()}
                        for i, r in enumerate(new, 1)
                    ],
                )
        return {r.prompt_id for r in new}

    def get(self, prompt_id: str) -> Registration | None:
        """The registration of `prompt_id`, or None."""
        with self._lock:
            found = self._items.get(prompt_id)
        if found is None:
            self._catch_up()
            with self._lock:
                found = self._items.get(prompt_id)
        return found

    def all(self) -> list[Registration]:
        """Every registration, in registration order."""
        self._catch_up()
        with self._lock:
            return list(self._items.values())

    def _catch_up(self) -> None:
        with self._lock:
            for row in rows_after(self._db, REGISTRATIONS, self._ns, self._seen, REGISTRATIONS.c.body):
                reg = Registration.model_validate_json(row.body)
                self._items[reg.prompt_id] = reg
                self._seen = row.seq
