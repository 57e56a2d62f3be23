"""Prompt rows from dataset files, read by Hugging Face `datasets` (and pyarrow under it), and the
prompt text of each row, found by the field names the common benchmark sets use.

Formats: `.jsonl`, `.json`, `.csv`, `.parquet`, and directories written by `Dataset.save_to_disk`.
Fields, in the order they are looked for: `question` (gsm8k), `problem` (math500), `prompt` (humaneval,
mbpp), `text` (mbpp), `instruction` + `input` (alpaca), `turns` (mt-bench), `conversations` /
`messages` (ShareGPT, chat). `--field NAME` names the field instead. `whole_chat_of` reads a chat row
as a whole, finished conversation instead (`--whole-chats`: training data, not a prompt to answer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
TEXT_FIELDS = ("question", "problem", "prompt", "text")
CHAT_FIELDS = ("conversations", "messages")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class BadRow(ValueError):
    """A row whose prompt cannot be read; the message names the file, the row and the field."""


@dataclass(frozen=True)
class Row:
    """One prompt of a file: its user text (or its chat messages: the leading ones, or a whole chat), and
    where it came from."""

    file: Path
    index: int
    text: str | None
    messages: list[dict[str, str]] | None = None
    later_turns: tuple[str, ...] = ()  # mt-bench: user turns after the first, each answered in order


def read_rows(path: Path) -> Iterator[Mapping[str, Any]]:
    """The rows of one dataset file or `save_to_disk` directory (ValueError for an unknown format)."""
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            raise ValueError(f"{path} holds several splits {list(loaded)}: give one split's directory")
        yield from loaded
        return
    builder = _BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(
            f"{path}: unknown format {path.suffix!r} (use .jsonl, .json, .csv, .parquet or a save_to_disk directory)"
        )
    yield from datasets.load_dataset(builder, data_files=str(path), split="train")


def prompt_of(row: Mapping[str, Any], file: Path, index: int, field: str | None = None) -> Row:
    """The prompt of a row, by `field` or by the first known field it has; BadRow if there is none."""
    where = f"{file} row {index}"
    if field is not None:
        return Row(file, index, _text(row.get(field), where, field))
    for name in TEXT_FIELDS:
        if row.get(name) is not None:
            return Row(file, index, _text(row[name], where, name))
    if row.get("instruction") is not None:
        instruction, extra = _text(row["instruction"], where, "instruction"), row.get("input")
        return Row(file, index, f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra else instruction)
    if row.get("turns") is not None:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise BadRow(f"{where}: field 'turns' must be a non-empty list of strings")
        return Row(file, index, turns[0], later_turns=tuple(turns[1:]))
    for name in CHAT_FIELDS:
        if row.get(name) is not None:
            return Row(file, index, None, _leading_messages(row[name], where, name))
    raise BadRow(
        f"{where}: no prompt field (looked for {', '.join(TEXT_FIELDS)}, instruction, turns, "
        f"{', '.join(CHAT_FIELDS)}; name one with --field)"
    )


def _text(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRow(f"{where}: field {field!r} must be non-empty text, got {value!r:.80}")
    return value


def whole_chat_of(row: Mapping[str, Any], file: Path, index: int, field: str | None = None) -> Row:
    """A chat row as one finished conversation: every message, the trailing ones after its last assistant
    turn dropped (as speculators' preprocessing drops them); BadRow for a row without a chat, or without an
    assistant turn after a user turn."""
    where = f"{file} row {index}"
    names = (field,) if field is not None else CHAT_FIELDS
    name = next((n for n in names if row.get(n) is not None), None)
    if name is None:
        raise BadRow(f"{where}: --whole-chats reads conversations/messages, and the row has no {' or '.join(names)}")
    messages = _messages(row[name], where, name)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    if not users or last < users[0]:
        raise BadRow(f"{where}: field {name!r} has no assistant turn after a user turn")
    return Row(file, index, None, messages[: last + 1])


def _messages(value: Any, where: str, field: str) -> list[dict[str, str]]:
    """Every message of a chat, its role normalised (human/gpt/system/...)."""
    if not isinstance(value, list) or not value:
        raise BadRow(f"{where}: field {field!r} must be a non-empty list of messages")
    return [_message(m, i, where, field) for i, m in enumerate(value)]


def _message(m: Any, i: int, where: str, field: str) -> dict[str, str]:
    role = m.get("role", m.get("from")) if isinstance(m, Mapping) else None
    content = m.get("content", m.get("value")) if isinstance(m, Mapping) else None
    if role not in _ROLES or not isinstance(content, str):
        raise BadRow(f"{where}: field {field!r} message {i} needs a known role and text content, got {m!r:.80}")
    return {"role": _ROLES[role], "content": content}


def _leading_messages(value: Any, where: str, field: str) -> list[dict[str, str]]:
    """A chat up to and including its first user message (the prompt the target answers); the messages
    after it are not read."""
    if not isinstance(value, list) or not value:
        raise BadRow(f"{where}: field {field!r} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        out.append(_message(m, i, where, field))
        if out[-1]["role"] == "user":
            return out
    raise BadRow(f"{where}: field {field!r} has no user message")
