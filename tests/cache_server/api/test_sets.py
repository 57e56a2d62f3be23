"""Prompt sets and rendering settings on the server: what each registration records, `GET /sets`,
`GET /prompts?set=`, membership across restarts, and jobs restricted to sets."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from cache_server.api.app import create_app
from tests.cache_server.helpers import error_message, metric, register_ready, serve_settings

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]


def test_registrations_record_sets_template_and_thinking(tiny_target: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_target)
    settings = serve_settings(tiny_target, tmp_path / "store", checkpoint_root=tmp_path)
    with TestClient(create_app(settings)) as client:
        plain, thinking_off, thinking_on = register_ready(
            client,
            [
                {"text": "def fib(n):", "sets": ["humaneval"]},
                {"messages": QUESTION, "enable_thinking": False, "sets": ["gsm8k"]},
                {"messages": QUESTION, "enable_thinking": True, "sets": ["gsm8k", "both"]},
            ],
        )
        register_ready(client, [{"text": "def fib(n):", "sets": ["both"]}])  # the same prompt joins a second set
        template = hashlib.sha256(tokenizer.chat_template.encode()).hexdigest()
        for pid, thinking in ((thinking_off, False), (thinking_on, True)):
            state = client.get(f"/prompts/{pid}").json()
            want = tokenizer.apply_chat_template(
                QUESTION, add_generation_prompt=True, enable_thinking=thinking, tokenize=True, return_dict=True
            )["input_ids"]
            assert state["token_ids"][: state["prompt_len"]] == list(want)
            assert (state["chat_template_sha256"], state["enable_thinking"]) == (template, thinking)
        assert thinking_off != thinking_on  # the template renders them differently
        state = client.get(f"/prompts/{plain}").json()
        assert (state["sets"], state["chat_template_sha256"], state["enable_thinking"]) == (
            ["both", "humaneval"],
            None,
            None,
        )
        assert metric(client, "cache_server_prompts_pending") == 0
        sets = {s["name"]: s for s in client.get("/sets").json()["sets"]}
        # no response: nothing to disagree with
        GREEDY = {"greedy_mismatches": 0, "prompts_not_greedy": 0, "outside_support": 0, "prompts_outside_support": 0}
        NONE_PENDING = {"queued": 0, "generating": 0, "capturing": 0}
        assert sets == {
            "both": {
                "name": "both",
                "total": 2,
                "pending": 0,
                **NONE_PENDING,
                "ready": 2,
                "failed": 0,
                **GREEDY,
                "settings": {"T=0": 2},
            },
            "gsm8k": {
                "name": "gsm8k",
                "total": 2,
                "pending": 0,
                **NONE_PENDING,
                "ready": 2,
                "failed": 0,
                **GREEDY,
                "settings": {"T=0": 2},
            },
            "humaneval": {
                "name": "humaneval",
                "total": 1,
                "pending": 0,
                **NONE_PENDING,
                "ready": 1,
                "failed": 0,
                **GREEDY,
                "settings": {"T=0": 1},
            },
        }
        page = client.get("/prompts", params={"set": "both"}).json()
        assert (page["total"], [p["prompt_id"] for p in page["prompts"]]) == (2, [thinking_on, plain])
        assert "no prompt set 'nope'" in error_message(
            client.get("/prompts", params={"set": "nope"}), 422, "unknown_sets"
        )
        follow_up = [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "response_of": plain},
            {"role": "user", "content": "And then?"},
        ]
        [second] = register_ready(client, [{"messages": follow_up}])
        answer = client.get(f"/prompts/{plain}").json()
        text = tokenizer.decode(answer["token_ids"][answer["prompt_len"] :], skip_special_tokens=True)
        filled = [follow_up[0], {"role": "assistant", "content": text}, follow_up[2]]
        want = tokenizer.apply_chat_template(filled, add_generation_prompt=True, tokenize=True, return_dict=True)
        state = client.get(f"/prompts/{second}").json()
        assert state["token_ids"][: state["prompt_len"]] == list(want["input_ids"])
        refused = [
            ({"role": "assistant", "response_of": "nope"}, "no such prompt"),
            ({"role": "user", "response_of": plain}, "fills in an assistant turn"),
            ({"role": "assistant", "content": "x", "response_of": plain}, "exactly one of"),
        ]
        for bad_message, why in refused:
            body = {"prompts": [{"messages": [follow_up[0], bad_message, follow_up[2]]}]}
            assert why in error_message(client.post("/prompts", json=body), 422)
        bad = {"prompts": [{"text": "x", "enable_thinking": True}]}
        assert "needs messages" in error_message(client.post("/prompts", json=bad), 422)
        bad = {"prompts": [{"text": "x", "sets": ["has space"]}]}
        error_message(client.post("/prompts", json=bad), 422)

        (tmp_path / "step_1.pt").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip: a valid archive
        job = client.post("/jobs", json={"checkpoint": "step_1.pt", "sets": ["gsm8k"]}).json()
        assert job["sets"] == ["gsm8k"]
        claim = client.post("/jobs/claim", json={"worker": "w", "lease_s": 60}).json()
        assert sorted(claim["prompt_ids"]) == sorted([thinking_off, thinking_on])
        assert claim["set_members"] == {"gsm8k": [thinking_off, thinking_on]}
        assert "['nope'] do not exist" in error_message(
            client.post("/jobs", json={"checkpoint": "step_1.pt", "sets": ["nope"]}), 422, "unknown_sets"
        )
        error_message(
            client.post("/jobs", json={"checkpoint": "step_1.pt", "sets": ["gsm8k"], "prompts": [plain]}), 422
        )

    with TestClient(create_app(settings)) as client:  # restarted: membership was persisted
        listed = client.get("/sets").json()
        assert [s["total"] for s in listed["sets"]] == [2, 2, 1]
        # the follow-up belongs to no set: counted there, and in all prompts
        assert (listed["no_set"]["total"], listed["no_set"]["ready"], listed["all_prompts"]["total"]) == (1, 1, 4)
        assert listed["all_prompts"]["settings"] == {"T=0": 4}
        assert client.get(f"/prompts/{plain}").json()["sets"] == ["both", "humaneval"]
