"""Registrations and prompt sets in the coordination database, on SQLite and on Postgres: what one
server adds, another sees; registrations an older server kept in the store are taken over."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cache_server.compute.instances import DEFAULT_DB_FILE, import_store_registrations
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.compute.sets import SetRegistry
from cache_server.coordination.database import Database
from cache_server.store.hidden_store import HiddenStore


def registration(n: int) -> Registration:
    ids = (5, 6, n)
    return Registration(prompt_id=prompt_id_for(ids, None, 8), prompt_ids=ids, response_ids=None, max_new_tokens=8)


def test_two_servers_see_each_others_registrations_and_sets(db_location: str) -> None:
    a, b = Database(db_location), Database(db_location)  # as two server processes
    reg_a, reg_b = Registry(a, "fp"), Registry(b, "fp")
    sets_a, sets_b = SetRegistry(a, "fp"), SetRegistry(b, "fp")
    first, second = registration(1), registration(2)
    assert reg_a.add_many([first]) == {first.prompt_id} and not reg_b.add_many([first])  # one registration
    assert reg_b.add_many([second]) == {second.prompt_id}
    assert [r.prompt_id for r in reg_a.all()] == [first.prompt_id, second.prompt_id]
    assert reg_b.get(first.prompt_id) == first and reg_a.get("nope") is None
    sets_a.add("gsm8k", [first.prompt_id, second.prompt_id])
    sets_b.add("gsm8k", [second.prompt_id])  # already in it: stays where it is
    sets_b.add("code", [second.prompt_id])
    assert sets_a.names() == ["code", "gsm8k"]
    assert sets_a.members("gsm8k") == [first.prompt_id, second.prompt_id]
    assert sets_b.of(second.prompt_id) == ["code", "gsm8k"]
    assert sets_a.memberships() == {first.prompt_id: ["gsm8k"], second.prompt_id: ["code", "gsm8k"]}
    assert Registry(a, "other").all() == [] and SetRegistry(a, "other").names() == []


def test_registrations_kept_in_an_older_store_are_taken_over(tmp_path: Path) -> None:
    with HiddenStore(
        tmp_path / "store", fingerprint="fp", model_name="m", hidden_size=16, dtype=torch.float32
    ) as store:
        regs = [registration(n) for n in range(3)]
        for reg in regs:  # the layout servers used before the coordination database
            store.blobs.put(f"fp/requests/{reg.prompt_id}.json", reg.model_dump_json().encode())
        store.blobs.put("fp/sets/gsm8k.json", json.dumps([regs[2].prompt_id, regs[0].prompt_id]).encode())
        db = Database(str(tmp_path / "store" / DEFAULT_DB_FILE))
        registry, sets = Registry(db, "fp"), SetRegistry(db, "fp")
        import_store_registrations(store, registry, sets)
        assert sorted(r.prompt_id for r in registry.all()) == sorted(r.prompt_id for r in regs)
        assert registry.get(regs[1].prompt_id) == regs[1]
        assert sets.members("gsm8k") == [regs[2].prompt_id, regs[0].prompt_id]
        store.blobs.put(f"fp/requests/{registration(9).prompt_id}.json", registration(9).model_dump_json().encode())
        import_store_registrations(store, registry, sets)  # only into an empty database
        assert len(registry.all()) == 3
