"""The peers' own loss masks of a chat, computed by their code in their environment (`.venv-peers`):
SpecForge's `GeneralParser` with its registered template, every assistant turn of one row; and
speculators' render-boundary rows, one row per assistant turn, rendered by a vLLM `/render` endpoint.

Run as a script there (`python peer_masks.py specforge MODEL TEMPLATE CONV` or `speculators URL CONV`,
a JSON answer on stdout); imported here, `specforge_mask` and `speculators_rows` run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from testing.peers import run_in_peers

MAX_LENGTH = 512  # the test engine's max_model_len: vLLM refuses to truncate beyond it


def specforge_mask(model: Path, template: str, conversation: list[dict[str, str]], work: Path) -> dict[str, list[int]]:
    """SpecForge's `input_ids` and `loss_mask` of `conversation` (its template `template`, e.g. "qwen")."""
    return _run("specforge", str(model), template, _saved(conversation, work))


def speculators_rows(render_url: str, conversation: list[dict[str, str]], work: Path) -> list[dict[str, list[int]]]:
    """speculators' rows of `conversation` (`input_ids`, `loss_mask`), rendered by the engine at `render_url`."""
    return _run("speculators", render_url, _saved(conversation, work))


def _saved(conversation: list[dict[str, str]], work: Path) -> str:
    path = work / "conversation.json"
    path.write_text(json.dumps(conversation))
    return str(path)


def _run(*args: str) -> Any:
    return json.loads(run_in_peers(Path(__file__), *args).strip().splitlines()[-1])


def _specforge(model: str, template: str, conversation: list[dict[str, str]]) -> dict[str, list[int]]:
    from specforge.data.parse import GeneralParser  # the peers' environment only
    from specforge.data.template import TEMPLATE_REGISTRY
    from transformers import AutoTokenizer

    parser = GeneralParser(AutoTokenizer.from_pretrained(model), TEMPLATE_REGISTRY.get(template))
    input_ids, loss_mask = parser.parse(conversation, MAX_LENGTH)
    return {"input_ids": input_ids.tolist(), "loss_mask": loss_mask.tolist()}


def _speculators(render_url: str, conversation: list[dict[str, str]]) -> list[dict[str, list[int]]]:
    from speculators.data_generation import preprocessing  # the peers' environment only

    rows = preprocessing._render_boundary_rows(
        preprocessing._normalize_conversation(conversation), render_url, MAX_LENGTH
    )
    return [{"input_ids": list(r["input_ids"]), "loss_mask": list(r["loss_mask"])} for r in rows]


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    conv = json.loads(Path(rest[-1]).read_text())
    answer = _specforge(rest[0], rest[1], conv) if command == "specforge" else _speculators(rest[0], conv)
    print(json.dumps(answer))
