"""The free-space check counts what is registered and not captured yet: prompts another server holds
(queued or running in the coordination database) will still write their layers, so a registration
that fits the free space alone, but not beside them, is refused; once they are gone, it is taken."""

from __future__ import annotations

import math
from pathlib import Path

from cache_server.compute.instances import DEFAULT_DB_FILE
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database
from tests.cache_server.helpers import app_client, error_message
from tests.cache_server.test_plan import _prompts, small_disk  # noqa: F401  (the fixture)

TOKENS = 200


def _held_by_another_server(store: Path, namespace: str, n: int) -> CaptureQueue:
    """`n` prompts of TOKENS tokens registered, and claimed by a server that has not written them yet."""
    db = Database(str(store / DEFAULT_DB_FILE))
    regs = [
        Registration(
            prompt_id=prompt_id_for(tuple(p["token_ids"]), tuple(p["response_token_ids"]), None),
            prompt_ids=tuple(p["token_ids"]),
            response_ids=tuple(p["response_token_ids"]),
            max_new_tokens=None,
        )
        for p in _prompts(n, TOKENS, offset=5000)
    ]
    Registry(db, namespace).add_many(regs)
    other = CaptureQueue(db, namespace, "other", lease_s=3600)
    other.request_many({r.prompt_id: [0, 5] for r in regs})
    while other.claim() is not None:
        pass
    return other


def test_prompts_registered_but_not_captured_count_against_the_free_space(tiny_target: Path, small_disk: Path) -> None:  # noqa: F811
    store = small_disk / "store"
    with app_client(tiny_target, store, capture_layers="0,5") as client:
        namespace = client.get("/model").json()["fingerprint"]
    new = _prompts(2, TOKENS, offset=0)
    with app_client(tiny_target, store, capture_layers="0,5") as client:
        plan = client.get("/plan", params={"prompts": 2, "tokens": TOKENS}).json()
        per_prompt = plan["capture_layers_bytes"] / 2
        assert plan["capture_layers_bytes"] < plan["free_bytes"]  # alone, the new prompts fit
    # Held elsewhere: together with the new ones more than is free, alone less.
    held = math.ceil((plan["free_bytes"] - per_prompt) / per_prompt)
    other = _held_by_another_server(store, namespace, held)
    with app_client(tiny_target, store, capture_layers="0,5") as client:
        refused = client.post("/prompts", json={"prompts": new})
        message = error_message(refused, 422, "storage_exceeded")
        assert f"{held} prompts registered but not captured yet" in message, message
        assert client.get("/prompts").json()["total"] == held  # nothing more registered
        for pid in other.unwritten():  # that server gives up on them: nothing more will be written
            other.fail(pid, "gave up")
        taken = client.post("/prompts", json={"prompts": new})
        assert taken.status_code == 202, taken.text
    print(f"free {plan['free_bytes']} bytes, {held} prompts held of ~{per_prompt:.0f} bytes each, 2 new")
