"""The loss masks stored here equal the peers' own masking of the same conversation on a ChatML
template: SpecForge's parser (every assistant turn of one row) and speculators' render-boundary rows
(one row per assistant turn, its earlier turns context), rendered by a real vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_server.client import CacheClient
from testing.engine import VllmServer, vllm_python
from testing.peer_masks import specforge_mask, speculators_rows
from testing.servers import free_port, running_server

pytestmark = [pytest.mark.slow, pytest.mark.peers, pytest.mark.engine]
# SpecForge's "qwen" template puts its system prompt first; the conversation carries the same one.
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "def fib(n):"},
    {"role": "assistant", "content": "if n < 2:\n    return n"},
    {"role": "user", "content": "class Stack:"},
    {"role": "assistant", "content": "def push(self, item):\n    self.items.append(item)"},
]


@pytest.fixture(scope="module")
def cache(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheClient]:
    with running_server(tiny_target, tmp_path_factory.mktemp("store")) as url, CacheClient(url) as client:
        yield client


def _stored(client: CacheClient, messages: list[dict[str, str]], mode: str) -> dict[str, list[int]]:
    [reg] = client.register([{"messages": messages, "loss_mask": mode}])
    client.wait_ready([reg.prompt_id])
    hidden = client.hidden(reg.prompt_id, [0])
    return {"input_ids": hidden.token_ids.tolist(), "loss_mask": hidden.metadata.loss_mask().tolist()}


def test_every_assistant_turn_as_specforge_masks_it(cache: CacheClient, tiny_target: Path, tmp_path: Path) -> None:
    theirs = specforge_mask(tiny_target, "qwen", CONVERSATION, tmp_path)
    assert sum(theirs["loss_mask"]) > 0
    assert _stored(cache, CONVERSATION, "assistant_turns") == theirs


def test_each_turn_as_speculators_rows_it(cache: CacheClient, tiny_target: Path, tmp_path: Path) -> None:
    if vllm_python() is None:
        pytest.fail("the vLLM environment .venv-vllm is missing: ./dev test (or .ci/run) builds it")
    # vLLM 0.32 serves /v1/chat/completions/render only with its scale-out endpoints on
    engine = VllmServer(tiny_target, free_port(), tmp_path / "vllm.log", "--enable-scale-out")
    engine.start()
    try:
        rows = speculators_rows(engine.url, CONVERSATION, tmp_path)
    finally:
        engine.stop()
    turns = [j for j, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    assert len(rows) == len(turns) == 2
    for row, j in zip(rows, turns, strict=True):
        assert _stored(cache, CONVERSATION[: j + 1], "last_turn") == row
