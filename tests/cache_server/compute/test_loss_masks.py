"""The loss mask stored with a prompt and served with its states: the response by default, a chat's
assistant turns (each exactly its content and end-of-turn tokens, read back as text), the last turn
only, or 0/1 per token as given; a default mask keeps a prompt's id; what cannot be masked is refused."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from schemas.hidden import HiddenMetadata
from schemas.loss_mask import mask_of, spans_of
from tests.cache_server.helpers import app_client, error_message, get_hidden

CHAT = [
    {"role": "user", "content": "def fib(n):"},
    {"role": "assistant", "content": "return n"},
    {"role": "user", "content": "class Stack:"},
]
FINISHED = [*CHAT, {"role": "assistant", "content": "self.items = []"}]


def _register(client: TestClient, prompts: list[dict], generate: int | None = None) -> list[str]:  # type: ignore[type-arg]
    body: dict = {"prompts": prompts, **({"generate": {"max_new_tokens": generate}} if generate else {})}  # type: ignore[type-arg]
    r = client.post("/prompts", json=body)
    assert r.status_code == 202, r.text
    return [p["prompt_id"] for p in r.json()["prompts"]]


def _served(client: TestClient, prompt_id: str) -> tuple[list[int], list[int]]:
    """(token ids, the served loss mask), from `/hidden`'s metadata, and the same in `/prompts/{id}`."""
    tensors, meta = get_hidden(client, prompt_id, "0")
    tokens = tensors["token_ids"].tolist()
    stated = client.get(f"/prompts/{prompt_id}").json()["loss_spans"]
    default = [0] * int(meta["prompt_len"]) + [1] * (len(tokens) - int(meta["prompt_len"]))
    served = default if "loss_spans" not in meta else _mask(meta["loss_spans"], len(tokens))
    assert served == (default if stated is None else mask_of(tuple(map(tuple, stated)), 0, len(tokens)).tolist())
    return tokens, served


def _mask(text: str, n: int) -> list[int]:
    spans = tuple(tuple(map(int, part.split("-"))) for part in text.split(",")) if text else ()
    return mask_of(spans, 0, n).tolist()  # type: ignore[arg-type]


def _trained_text(tokenizer, tokens: list[int], mask: list[int]) -> list[str]:  # type: ignore[no-untyped-def]
    return [tokenizer.decode(tokens[lo:hi]) for lo, hi in spans_of(mask)]


def test_a_chats_assistant_turns_and_its_response_are_trained_on(tiny_target: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    with app_client(tiny_target, tmp_path / "store") as client:
        [chat, answer_only] = _register(
            client, [{"messages": CHAT, "loss_mask": "assistant_turns"}, {"messages": CHAT}], 5
        )
        tokens, mask = _served(client, chat)
        prompt_len = client.get(f"/prompts/{chat}").json()["prompt_len"]
        response = tokenizer.decode(tokens[prompt_len:])
        assert _trained_text(tokenizer, tokens, mask) == [
            "return n<|im_end|>\n",  # the earlier turn, its end-of-turn tokens with it
            response,  # the generated response, whole
        ]
        # by default a chat awaiting its answer trains on the answer: speculators' row of that turn
        assert _trained_text(tokenizer, *_served(client, answer_only)) == [response]
        [finished, last] = _register(client, [{"messages": FINISHED}, {"messages": FINISHED, "loss_mask": "last_turn"}])
        tokens, mask = _served(client, finished)
        assert tokenizer.decode(tokens).endswith("self.items = []<|im_end|>\n")  # no generation prompt after it
        assert _trained_text(tokenizer, tokens, mask) == ["return n<|im_end|>\n", "self.items = []<|im_end|>\n"]
        assert _trained_text(tokenizer, *_served(client, last)) == ["self.items = []<|im_end|>\n"]


def test_a_prefilled_generation_prompt_bounds_the_turn_where_the_history_ends(
    tiny_target: Path, tmp_path: Path
) -> None:
    """Without thinking the tiny template opens its generation prompt with an empty think block, which a
    recorded turn does not have: the turn starts where the two renders part (speculators' fallback)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = _register(client, [{"messages": FINISHED, "enable_thinking": False}])
        tokens, mask = _served(client, pid)
        assert _trained_text(tokenizer, tokens, mask) == ["return n<|im_end|>\n", "self.items = []<|im_end|>\n"]


def test_the_default_mask_keeps_ids_and_a_given_one_is_served_as_given(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        [chat] = _register(client, [{"messages": CHAT[:1], "response_token_ids": [40, 41, 42]}])
        tokens, mask = _served(client, chat)
        [same] = _register(client, [{"token_ids": tokens[:-3], "response_token_ids": [40, 41, 42]}])
        assert same == chat and mask == [0] * (len(tokens) - 3) + [1, 1, 1]
        given = [1, 0, 1, 1, 0, 0]
        [masked] = _register(client, [{"token_ids": [5, 6, 7, 8], "response_token_ids": [9, 10], "loss_mask": given}])
        [plain] = _register(client, [{"token_ids": [5, 6, 7, 8], "response_token_ids": [9, 10]}])
        assert masked != plain
        assert _served(client, masked) == ([5, 6, 7, 8, 9, 10], given)
        assert _served(client, plain) == ([5, 6, 7, 8, 9, 10], [0, 0, 0, 0, 1, 1])


def test_what_cannot_be_masked_is_refused(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:

        def refused(prompt: dict, generate: int | None = None) -> str:  # type: ignore[type-arg]
            body: dict = {"prompts": [prompt], **({"generate": {"max_new_tokens": generate}} if generate else {})}  # type: ignore[type-arg]
            return error_message(client.post("/prompts", json=body), 422)

        assert "2 entries for 3 tokens" in refused({"token_ids": [5, 6, 7], "loss_mask": [0, 1]})
        assert "cannot go with generate" in refused({"token_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, generate=4)
        assert "needs messages" in refused({"text": "def fib", "loss_mask": "assistant_turns"})
        assert "finished" in refused({"messages": FINISHED}, generate=4)
        assert "finished" in refused({"messages": FINISHED, "response_token_ids": [5]})
        assert "less than or equal to 1" in refused({"token_ids": [5, 6], "loss_mask": [0, 2]})


def test_a_row_range_carries_those_rows_of_the_mask(tiny_target: Path, tmp_path: Path) -> None:
    given = [1, 0, 1, 1, 0, 0, 1]
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = _register(client, [{"token_ids": [5, 6, 7, 8, 9], "response_token_ids": [10, 11], "loss_mask": given}])
        _, meta = get_hidden(client, pid, "0", start=2, stop=6)
    metadata = HiddenMetadata.from_strings(meta)
    assert metadata.loss_mask().tolist() == given[2:6]
