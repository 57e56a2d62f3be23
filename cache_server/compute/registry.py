"""Registered prompts: content-addressed ids, persisted so that pending work survives a restart.

A registration is one small JSON file per prompt under `<namespace>/requests/`, written aside
and renamed, so a crash never leaves a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict


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

    @property
    def prompt_len(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_ids)


def prompt_id_for(prompt_ids: tuple[int, ...], response_ids: tuple[int, ...] | None, max_new_tokens: int | None) -> str:
    """Same tokens (and the same response request) -> the same id, on any server."""
    if response_ids is not None:
        max_new_tokens = None  # a given response makes generation settings irrelevant
    key = json.dumps({"prompt": prompt_ids, "response": response_ids, "generate": max_new_tokens})
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class Registry:
    """Thread-safe map of prompt id -> registration, mirrored on disk."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._items: dict[str, Registration] = {}
        for path in sorted(self._dir.glob("*.json")):
            reg = Registration.model_validate_json(path.read_text())
            self._items[reg.prompt_id] = reg
        for leftover in self._dir.glob("*.tmp"):
            leftover.unlink(missing_ok=True)

    def add(self, reg: Registration) -> bool:
        """Persist a registration; False if the id was already registered (a no-op)."""
        with self._lock:
            if reg.prompt_id in self._items:
                return False
            tmp = self._dir / f"{reg.prompt_id}.tmp"
            tmp.write_text(reg.model_dump_json())
            os.replace(tmp, self._dir / f"{reg.prompt_id}.json")
            self._items[reg.prompt_id] = reg
            return True

    def get(self, prompt_id: str) -> Registration | None:
        """The registration of `prompt_id`, or None."""
        with self._lock:
            return self._items.get(prompt_id)

    def all(self) -> list[Registration]:
        """Every registration, in no particular order."""
        with self._lock:
            return list(self._items.values())
