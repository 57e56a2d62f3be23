"""`eval-worker prompts add` against a real server: dataset files of the common benchmark shapes become
sets, rendered with the target's chat template exactly as `tokenizer.apply_chat_template` renders them
(thinking on and off), and a malformed row registers nothing unless --skip-bad; with --whole-chats, chat
rows become finished conversations rendered as the template renders them, trained on their assistant turns."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import pytest
from transformers import AutoTokenizer

from cache_server.client import CacheClient
from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from schemas.loss_mask import spans_of
from testing.servers import running_server

pytestmark = pytest.mark.slow
GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "7"},
    {"question": "What is 6 times 7?", "answer": "42"},
]
HUMANEVAL = [
    {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n"},
    {"task_id": "HumanEval/1", "prompt": "def fib(n):\n"},
]
SUFFIX = " Please reason step by step."
CHATS: list[dict[str, Any]] = [
    {
        "conversations": [
            {"from": "system", "value": "Answer in one word."},
            {"from": "human", "value": "Capital of France?"},
            {"from": "gpt", "value": "Paris"},
            {"from": "human", "value": "And of Italy?"},
            {"from": "gpt", "value": "Rome"},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "def add(a, b):"},
            {"from": "gpt", "value": "return a + b"},
            {"from": "human", "value": "Thanks!"},  # trailing: dropped, nothing answers it
        ]
    },
    {"question": "What is 6 times 7?"},  # no chat: refused with --whole-chats
]
MT_BENCH = [
    {"question_id": 81, "turns": ["Write a haiku about Python.", "Now make it rhyme."]},
    {"question_id": 82, "turns": ["Name a prime number.", "Is it even?"]},
]


def _render(tokenizer: Any, text: str | list[dict[str, str]], thinking: bool | None) -> list[int]:
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    extra = {} if thinking is None else {"enable_thinking": thinking}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, **extra)
    return list(out["input_ids"])


def test_sets_from_files_render_as_the_chat_template(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    gsm8k = tmp_path / "gsm8k.parquet"
    datasets.Dataset.from_list(GSM8K).to_parquet(str(gsm8k))
    humaneval = tmp_path / "humaneval.jsonl"
    humaneval.write_text("".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    mt_bench = tmp_path / "mt_bench.jsonl"
    mt_bench.write_text("".join(json.dumps(r) + "\n" for r in MT_BENCH))
    on_disk = tmp_path / "humaneval-disk"
    datasets.Dataset.from_list(HUMANEVAL).save_to_disk(str(on_disk))
    with running_server(tiny_target, tmp_path / "store") as url:
        base = ["prompts", "add", "--server", url, "--max-new-tokens", "4"]
        assert main([*base, str(gsm8k), "--set", "gsm8k", "--suffix", SUFFIX, "--disable-thinking", "--wait"]) == 0
        assert main([*base, str(gsm8k), "--set", "gsm8k-think", "--suffix", SUFFIX, "--enable-thinking"]) == 0
        assert main([*base, str(humaneval), "--set", "humaneval", "--wait"]) == 0
        assert main([*base, str(on_disk), "--set", "humaneval-disk", "--no-chat-template", "--wait"]) == 0
        assert main([*base, str(mt_bench), "--set", "mt-bench", "--disable-thinking", "--wait"]) == 0
        out = capsys.readouterr().out
        assert "2 rows registered in set 'gsm8k' as 2 prompts\n" in out
        assert "2 rows registered in set 'mt-bench' as 4 prompts (2 later turns)" in out
        with CacheClient(url) as client:
            client.wait_ready([p.prompt_id for p in client.prompts()])
            for name, rows, field, thinking, suffix in (
                ("gsm8k", GSM8K, "question", False, SUFFIX),
                ("gsm8k-think", GSM8K, "question", True, SUFFIX),
                ("humaneval", HUMANEVAL, "prompt", None, ""),
            ):
                states = [client.prompt(p.prompt_id) for p in client.prompts(set_name=name)]
                assert [s.token_ids[: s.prompt_len] for s in states] == [
                    _render(tokenizer, r[field] + suffix, thinking) for r in rows
                ]
                assert all(s.enable_thinking is thinking and s.chat_template_sha256 for s in states)
                assert all(s.num_tokens == s.prompt_len + 4 for s in states)  # --max-new-tokens
            plain = [client.prompt(p.prompt_id) for p in client.prompts(set_name="humaneval-disk")]
            assert [s.token_ids[: s.prompt_len] for s in plain] == [
                tokenizer(r["prompt"])["input_ids"] for r in HUMANEVAL
            ]
            assert all(s.chat_template_sha256 is None for s in plain)
            # Two turns per conversation, each its own prompt: turn 2 holds the target's own answer to turn 1.
            turns = [client.prompt(p.prompt_id) for p in client.prompts(set_name="mt-bench")]
            assert [s.name for s in turns] == [
                "mt_bench.jsonl:0",
                "mt_bench.jsonl:1",
                "mt_bench.jsonl:0:turn2",
                "mt_bench.jsonl:1:turn2",
            ]
            for first, second, row in zip(turns[:2], turns[2:], MT_BENCH, strict=True):
                assert first.token_ids[: first.prompt_len] == _render(tokenizer, row["turns"][0], False)
                answer = tokenizer.decode(first.token_ids[first.prompt_len :], skip_special_tokens=True)
                chat = [
                    {"role": "user", "content": row["turns"][0]},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": row["turns"][1]},
                ]
                assert second.token_ids[: second.prompt_len] == _render(tokenizer, chat, False)
                assert second.num_tokens == second.prompt_len + 4
            counts = {s.name: (s.total, s.ready) for s in client.sets().sets}
        assert counts == {
            "gsm8k": (2, 2),
            "gsm8k-think": (2, 2),
            "humaneval": (2, 2),
            "humaneval-disk": (2, 2),
            "mt-bench": (4, 4),
        }


def test_a_malformed_row_registers_nothing_unless_skipped(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "mixed.jsonl"
    bad.write_text(
        json.dumps({"question": "fine"})
        + "\n"
        + json.dumps({"question": ""})
        + "\n"
        + json.dumps({"turns": ["one", 2]})
        + "\n"
    )
    with running_server(tiny_target, tmp_path / "store") as url:
        base = ["prompts", "add", str(bad), "--server", url, "--set", "mixed", "--max-new-tokens", "2"]
        assert main(base) == ExitCode.usage
        assert f"{bad} row 1: field 'question' must be non-empty text" in capsys.readouterr().err
        with CacheClient(url) as client:
            assert client.prompts() == [] and client.sets().sets == []
            assert main([*base, "--skip-bad"]) == 0
            out = capsys.readouterr().out
            assert (
                "row 2: field 'turns' must be a non-empty list of strings" in out
                and "1 rows registered in set 'mixed' as 1 prompts" in out
            )
            assert [s.total for s in client.sets().sets] == [1]


def test_a_dry_run_prints_what_registering_would_store_and_registers_nothing(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = tmp_path / "gsm8k.jsonl", tmp_path / "mt_bench.jsonl"
    files[0].write_text("".join(json.dumps(row) + "\n" for row in GSM8K))
    files[1].write_text("".join(json.dumps(row) + "\n" for row in MT_BENCH))
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    first_turns = [r["question"] for r in GSM8K] + [r["turns"][0] for r in MT_BENCH]
    tokens = sum(len(_render(tokenizer, text, None)) + 16 for text in first_turns)  # each response at its full 16
    with running_server(tiny_target, tmp_path / "store") as url:
        argv = ["prompts", "add", *map(str, files), "--server", url, "--set", "mixed", "--max-new-tokens", "16"]
        assert main([*argv, "--dry-run"]) == ExitCode.ok
        with CacheClient(url) as client:
            assert client.prompts() == [] and client.sets().sets == []  # nothing registered
            info = client.model()
    out = capsys.readouterr().out
    lines = {line[:19].strip(): line[19:] for line in out.splitlines()}
    assert lines["prompts"] == f"4, {tokens} tokens in all"
    per_token_all = info.hidden_size * 4 * info.num_layers  # float32 on CPU, every layer captured
    assert lines["capture layers"].endswith(f"({math.ceil(tokens * per_token_all / 1.45)} bytes, 6 layers)")
    assert "not counted: 2 later turns of multi-turn rows (tokenized once the earlier turns are answered)" in out


def test_sampled_sets_register_each_sample_with_its_setting_and_refuse_bad_settings_in_one_line(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    humaneval = tmp_path / "humaneval.jsonl"
    humaneval.write_text("".join(json.dumps(r) + "\n" for r in HUMANEVAL))
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url) as client:
        base = ["prompts", "add", "--server", url, "--max-new-tokens", "4", str(humaneval)]
        sampled = [*base, "--set", "he-t06", "--temperature", "0.6", "--top-p", "0.95", "--samples", "3", "--seed", "5"]
        assert main([*sampled, "--wait"]) == 0
        assert "2 rows registered in set 'he-t06' as 6 prompts (3 samples each)" in capsys.readouterr().out
        states = [client.prompt(p.prompt_id) for p in client.prompts(set_name="he-t06")]
        assert sorted(s.sampling.seed for s in states if s.sampling) == [5, 5, 6, 6, 7, 7]
        assert {s.sampling.setting for s in states if s.sampling} == {"T=0.6 top_p=0.95"}
        assert all(s.outside_support == 0 for s in states)
        for flags, wanted in [
            (["--temperature", "-1"], "temperature"),
            (["--temperature", "1", "--top-p", "0"], "top_p"),
            (["--temperature", "1", "--top-k", "-2"], "top_k"),
            (["--samples", "2"], "samples > 1 needs temperature > 0"),
        ]:
            assert main([*base, "--set", "bad", *flags]) == ExitCode.usage
            err = capsys.readouterr().err.strip()
            assert wanted in err and "\n" not in err
        assert [s.name for s in client.sets().sets] == ["he-t06"]
        # The same rows into the same set: the same rendering only, so that they are the same prompts.
        for flags, wanted in [
            (["--suffix", SUFFIX], "prompt tokens, now"),
            (["--disable-thinking"], "thinking the template's default, now --disable-thinking"),
            (["--no-chat-template"], "the chat template on, now off"),
        ]:
            assert main([*sampled, *flags]) == ExitCode.usage
            err = capsys.readouterr().err.strip()
            assert "set 'he-t06' already holds 2 of these rows (humaneval.jsonl:0, humaneval.jsonl:1)" in err
            assert wanted in err and "--set NAME" in err and "\n" not in err
        assert client.sets().sets[0].total == 6  # nothing registered
        assert main([*base, "--set", "he-t06"]) == 0  # greedy responses of the same prompts
        assert "2 rows registered in set 'he-t06' as 2 prompts" in capsys.readouterr().out
        assert len({s.prompt_len for s in client.prompts(set_name="he-t06")}) == 2  # one per row


def _finished(row: dict[str, Any]) -> list[dict[str, str]]:
    """The chat a row stands for, written out by hand: roles renamed, the trailing user turn dropped."""
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    messages = [{"role": roles[m["from"]], "content": m["value"]} for m in row["conversations"]]
    return messages[:-1] if messages[-1]["role"] == "user" else messages


def _finished_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The tokenizer's own rendering of a finished chat: no generation prompt after its last turn."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=True, return_dict=True)
    return list(out["input_ids"])


def _trained_text(tokenizer: Any, token_ids: list[int], spans: Sequence[tuple[int, int]]) -> list[str]:
    return [tokenizer.decode(token_ids[lo:hi]) for lo, hi in spans]


def test_whole_chats_are_registered_finished_and_trained_on_their_assistant_turns(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    expected = [_finished(row) for row in CHATS[:2]]
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url) as client:
        base = ["prompts", "add", str(chats), "--server", url, "--whole-chats"]
        assert main([*base, "--set", "chats"]) == ExitCode.usage  # the question row stops it all
        assert f"{chats} row 2: --whole-chats reads conversations/messages" in capsys.readouterr().err
        assert client.prompts() == []
        assert main([*base, "--set", "chats", "--skip-bad", "--wait"]) == 0
        assert main([*base, "--set", "chats-last", "--loss-mask", "last_turn", "--skip-bad", "--wait"]) == 0
        out = capsys.readouterr().out
        assert (
            "2 rows registered in set 'chats' as 2 prompts; 1 bad rows skipped" in out and "row 2: --whole-chats" in out
        )
        for name, trained in (("chats", slice(None)), ("chats-last", slice(-1, None))):
            states = [client.prompt(p.prompt_id) for p in client.prompts(set_name=name)]
            assert [s.name for s in states] == ["chats.jsonl:0", "chats.jsonl:1"]
            for state, messages in zip(states, expected, strict=True):
                truth = _finished_ids(tokenizer, messages)
                assert state.token_ids == truth and state.num_tokens == len(truth)  # nothing generated
                answers = [m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant"]
                assert _trained_text(tokenizer, truth, state.loss_spans or []) == answers[trained]
                served = client.hidden(state.prompt_id, [0])  # the mask served with the states, the same
                spans = spans_of(served.metadata.loss_mask().tolist())
                assert _trained_text(tokenizer, served.token_ids.tolist(), spans) == answers[trained]


def test_whole_chats_refuse_what_makes_no_sense_with_them_and_plan_without_responses(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    chats, mt_bench = tmp_path / "chats.jsonl", tmp_path / "mt_bench.jsonl"
    chats.write_text("".join(json.dumps(r) + "\n" for r in CHATS[:2]))
    mt_bench.write_text("".join(json.dumps(r) + "\n" for r in MT_BENCH))
    with running_server(tiny_target, tmp_path / "store") as url, CacheClient(url) as client:
        base = ["prompts", "add", "--server", url, "--set", "chats"]
        for flags, wanted in [
            (["--whole-chats", "--suffix", SUFFIX], "--suffix with --whole-chats"),
            (["--whole-chats", "--no-chat-template"], "--no-chat-template with --whole-chats"),
            (["--whole-chats", "--temperature", "0.6", "--samples", "2"], "generates nothing"),
            (["--whole-chats", "--max-new-tokens", "4"], "generates nothing"),
            (
                ["--loss-mask", "last_turn"],
                "--loss-mask picks a whole chat's turns to train on: it needs --whole-chats",
            ),
        ]:
            assert main([*base, str(chats), *flags]) == ExitCode.usage
            err = capsys.readouterr().err.strip()
            assert wanted in err and "\n" not in err
        assert main([*base, str(mt_bench), "--whole-chats"]) == ExitCode.usage  # turns are not a finished chat
        assert f"{mt_bench} row 0: --whole-chats reads conversations/messages" in capsys.readouterr().err
        assert main([*base, str(chats), "--whole-chats", "--dry-run"]) == ExitCode.ok
        assert client.prompts() == [] and client.sets().sets == []  # nothing registered
    lines = {line[:19].strip(): line[19:] for line in capsys.readouterr().out.splitlines()}
    tokens = sum(len(_finished_ids(tokenizer, _finished(row))) for row in CHATS[:2])
    assert lines["prompts"] == f"2, {tokens} tokens in all"  # the chats alone: no response to generate
