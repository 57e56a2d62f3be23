"""Prompt sets (gsm8k, humaneval, ...): which registered prompts belong to which named set.

A prompt's id is its content, so the same prompt can join several sets over time; membership is kept
apart from the (immutable) registrations, one JSON list per set under `<namespace>/sets/`, replaced
atomically when a registration adds to it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path


class SetRegistry:
    """Thread-safe set name -> prompt ids (in the order they joined), mirrored on disk."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._members: dict[str, dict[str, None]] = {}  # insertion-ordered
        self._of: dict[str, list[str]] = {}  # prompt id -> its sets
        for path in sorted(self._dir.glob("*.json")):
            for prompt_id in json.loads(path.read_text()):
                self._join(path.stem, prompt_id)
        for leftover in self._dir.glob("*.tmp"):
            leftover.unlink(missing_ok=True)

    def add(self, name: str, prompt_ids: Iterable[str]) -> None:
        """Add prompts to a set (created on first use); prompts already in it stay where they are."""
        with self._lock:
            new = [p for p in prompt_ids if p not in self._members.get(name, {})]
            if not new:
                return
            for prompt_id in new:
                self._join(name, prompt_id)
            tmp = self._dir / f"{name}.tmp"
            tmp.write_text(json.dumps(list(self._members[name])))
            os.replace(tmp, self._dir / f"{name}.json")

    def names(self) -> list[str]:
        """Every set, by name."""
        with self._lock:
            return sorted(self._members)

    def members(self, name: str) -> list[str] | None:
        """A set's prompt ids in the order they joined, or None if there is no such set."""
        with self._lock:
            found = self._members.get(name)
            return None if found is None else list(found)

    def of(self, prompt_id: str) -> list[str]:
        """The sets a prompt belongs to."""
        with self._lock:
            return sorted(self._of.get(prompt_id, []))

    def _join(self, name: str, prompt_id: str) -> None:
        self._members.setdefault(name, {})[prompt_id] = None
        self._of.setdefault(prompt_id, []).append(name)
