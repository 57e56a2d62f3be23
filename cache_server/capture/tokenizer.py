"""The target's tokenizer side: prompts to token ids (text, chat messages through the chat template, or
ids as given) and where a chat's assistant turns lie in them, token ids back to text, and what the
model's config bounds (vocabulary, context, the ids a response ends after). Built from the model
directory's files alone, no weights."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from cache_server.errors import InvalidPrompt
from schemas.loss_mask import Spans
from schemas.prompts import ChatMessage, PromptSpec


def stop_token_ids(model_dir: Path) -> list[int]:
    """The ids a greedy response ends after: the generation config's EOS (none for some models), as
    transformers reads it (generation_config.json, else the model config)."""
    try:
        generation = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: transformers derives one from config.json
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
    eos = generation.eos_token_id
    return [int(t) for t in (eos if isinstance(eos, list) else [] if eos is None else [eos])]


class PromptTokenizer:
    """Encodes prompt specs for one target and checks them against its vocabulary and context."""

    def __init__(self, model_dir: Path, *, vocab_size: int, max_position_embeddings: int) -> None:
        """`vocab_size` and `max_position_embeddings`: the model config's (ids and lengths are checked)."""
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.vocab_size, self.max_position_embeddings = vocab_size, max_position_embeddings
        self.stop_token_ids = stop_token_ids(model_dir)

    @property
    def pad_token_id(self) -> int:
        """The id padded batches fill with (0 when the tokenizer has none: padded positions are masked)."""
        return int(self.tokenizer.pad_token_id or 0)

    def encode(self, spec: PromptSpec) -> list[int]:
        """Prompt token ids for a spec; raises InvalidPrompt for ids outside the vocabulary."""
        if spec.token_ids is not None:
            ids = list(spec.token_ids)
        elif spec.messages is not None:
            ids = self._render(_chat(spec.messages), spec.enable_thinking)
        else:
            ids = list(self.tokenizer(spec.text).input_ids)
        if not ids:
            raise InvalidPrompt("the prompt tokenizes to zero tokens")
        self.check_token_ids(ids, "token_ids")
        if spec.response_token_ids is not None:
            self.check_token_ids(spec.response_token_ids, "response_token_ids")
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Token ids as text, special tokens left out (how a chat client reads an answer back)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @property
    def chat_template_sha256(self) -> str | None:
        """sha256 of the tokenizer's chat template text (what renders `messages`), or None without one."""
        template = getattr(self.tokenizer, "chat_template", None)
        return hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) and template else None

    def assistant_turns(self, spec: PromptSpec, prompt_ids: Sequence[int], *, last_only: bool = False) -> Spans:
        """The token ranges of a chat's assistant turns (`last_only`: its last one) in its rendered
        `prompt_ids`, each from where the generation prompt ends to the end of the turn (its end-of-turn
        tokens included), bounded as speculators bounds them: `messages[:j]` rendered with the generation
        prompt against `messages[:j + 1]` without; where the generation prompt differs from the turn's
        own opening (a pre-filled think block), at their common prefix, provided the history agrees. A
        leading assistant turn has no prompt before it and is context. InvalidPrompt when no boundary is
        exact: the history disagrees, or the template renders the turn otherwise within the whole chat."""
        messages = _chat(spec.messages or [])
        turns = [j for j in range(1, len(messages)) if messages[j]["role"] == "assistant"]
        return tuple(
            self._turn(messages, j, prompt_ids, spec.enable_thinking) for j in (turns[-1:] if last_only else turns)
        )

    def _turn(
        self, messages: list[dict[str, str]], j: int, prompt_ids: Sequence[int], enable_thinking: bool | None
    ) -> tuple[int, int]:
        before = self._render(messages[:j], enable_thinking)
        through = self._render(messages[: j + 1], enable_thinking)
        start = len(before)
        if through[:start] != before:  # the generation prompt is not how the recorded turn opens
            start = next((i for i, (a, b) in enumerate(zip(before, through, strict=False)) if a != b), start)
            history = self._render(messages[:j], enable_thinking, generation_prompt=False)
            if through[: len(history)] != history or start < len(history):
                raise InvalidPrompt(
                    f"the chat template renders the history before assistant turn {j} differently once the turn "
                    "follows, so the turn has no exact boundary: give loss_mask as 0/1 per token"
                )
        if list(prompt_ids[: len(through)]) != through:
            raise InvalidPrompt(
                f"the chat template renders assistant turn {j} differently within the whole chat (it rewrites "
                "history), so the turn has no exact boundary: give loss_mask as 0/1 per token"
            )
        return start, len(through)

    def _render(
        self, messages: list[dict[str, str]], enable_thinking: bool | None, generation_prompt: bool | None = None
    ) -> list[int]:
        """A chat's token ids: by default a finished one (its last turn the assistant's) as it stands, as
        the peers render training data, otherwise with the generation prompt, ready for the answer."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidPrompt("the target's tokenizer has no chat template: send the prompt as text or token_ids")
        extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if generation_prompt is None:
            generation_prompt = messages[-1]["role"] != "assistant"
        try:
            out: Any = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=True, **extra
            )
        except Exception as e:  # jinja errors raised by the template itself (e.g. raise_exception)
            raise InvalidPrompt(f"the target's chat template refused these messages: {e}") from None
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def check_token_ids(self, ids: Sequence[int], field: str) -> None:
        """InvalidPrompt for ids outside the vocabulary."""
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidPrompt(f"{field} has ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")

    def check_length(self, total_tokens: int) -> None:
        """InvalidPrompt for a prompt plus response longer than the model's context."""
        if total_tokens > self.max_position_embeddings:
            raise InvalidPrompt(
                f"prompt plus response would be {total_tokens} tokens, beyond the model's context of "
                f"{self.max_position_embeddings}"
            )


def _chat(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """Messages as a chat template takes them (every `response_of` filled in before)."""
    if any(m.content is None for m in messages):
        raise InvalidPrompt("a response_of message must be filled in before the prompt is rendered")
    return [{"role": m.role, "content": m.content or ""} for m in messages]
