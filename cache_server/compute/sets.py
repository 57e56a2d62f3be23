"""Prompt sets (gsm8k, humaneval, ...): which registered prompts belong to which named set.

A prompt's id is its content, so the same prompt can join several sets over time; membership is kept
apart from the (immutable) registrations, one row per (set, prompt) in the coordination database.
Each server keeps a copy and catches up with rows added elsewhere, as the registry does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sqlalchemy import select

from cache_server.coordination.database import Database, max_seq, rows_after
from cache_server.coordination.tables import SET_MEMBERS


class SetRegistry:
    """Thread-safe set name -> prompt ids (in the order they joined), for one namespace."""

    def __init__(self, db: Database, namespace: str) -> None:
        self._db, self._ns = db, namespace
        self._lock = threading.Lock()
        self._members: dict[str, dict[str, None]] = {}  # insertion-ordered
        self._of: dict[str, list[str]] = {}  # prompt id -> its sets
        self._seen = 0

    def add(self, name: str, prompt_ids: Iterable[str]) -> None:
        """Add prompts to a set (created on first use); prompts already in it stay where they are."""
        table, wanted = SET_MEMBERS, list(dict.fromkeys(prompt_ids))
        with self._db.transaction(ordered=True) as c:
            mine = table.c.namespace == self._ns
            there = set(c.scalars(select(table.c.prompt_id).where(mine, table.c.set_name == name)))
            seq = max_seq(c, table.c.seq, mine)
            new = [p for p in wanted if p not in there]
            if new:
                c.execute(
                    table.insert(),
                    [
                        {"namespace": self._ns, "set_name": name, "prompt_id": p, "seq": seq + i}
                        for i, p in enumerate(new, 1)
                    ],
                )

    def names(self) -> list[str]:
        """Every set, by name."""
        self._catch_up()
        with self._lock:
            return sorted(self._members)

    def members(self, name: str) -> list[str] | None:
        """A set's prompt ids in the order they joined, or None if there is no such set."""
        self._catch_up()
        with self._lock:
            found = self._members.get(name)
            return None if found is None else list(found)

    def of(self, prompt_id: str) -> list[str]:
        """The sets a prompt belongs to."""
        self._catch_up()
        with self._lock:
            return sorted(self._of.get(prompt_id, []))

    def memberships(self) -> dict[str, list[str]]:
        """Every prompt's sets (for listings: one catch-up, not one per prompt)."""
        self._catch_up()
        with self._lock:
            return {p: sorted(names) for p, names in self._of.items()}

    def _catch_up(self) -> None:
        with self._lock:
            columns = (SET_MEMBERS.c.set_name, SET_MEMBERS.c.prompt_id)
            for row in rows_after(self._db, SET_MEMBERS, self._ns, self._seen, *columns):
                self._members.setdefault(row.set_name, {})[row.prompt_id] = None
                self._of.setdefault(row.prompt_id, []).append(row.set_name)
                self._seen = row.seq
