"""`cache-server prune` beside a running server: the set's prompts lose the layers outside the kept
ones, the other prompts keep theirs, and a pruned layer asked for again is recomputed exactly once,
bit-identical, by a server that had read the prompt's old manifest."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cache_server.cli import main
from tests.cache_server.helpers import app_client, metric, register_ready

COMPUTED = "cache_server_prompts_computed_total"


def _hidden(client, pid: str, layers: str, encoding: str = "safetensors") -> bytes:  # type: ignore[no-untyped-def]
    r = client.get("/hidden", params={"prompt_id": pid, "layers": layers, "encoding": encoding})
    assert r.status_code == 200, r.text
    return bytes(r.content)


def test_prune_a_set_beside_a_running_server(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store) as client:
        specs = [{"token_ids": list(range(3, 30)), "sets": ["eval"]}, {"token_ids": list(range(40, 70))}]
        pruned, kept = register_ready(client, specs)
        before = {
            (pid, enc): _hidden(client, pid, "0,2,4", enc)
            for pid in (pruned, kept)
            for enc in ("safetensors", "pieces")
        }
        computed = metric(client, COMPUTED)

        argv = ["prune", "--store", str(store), "--keep-layers", "1,3", "--grace-s", "0"]
        caplog.clear()
        assert main([*argv, "--set", "eval"]) == 0
        assert "dropped     layers [0, 2, 4, 5]" in capsys.readouterr().out
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]  # nor a traceback
        assert sorted(int(k.name) for k in store.glob(f"*/prompts/{pruned}/layers/*") if k.is_dir()) == [1, 3]
        assert sorted(int(k.name) for k in store.glob(f"*/prompts/{kept}/layers/*") if k.is_dir()) == list(range(6))

        assert _hidden(client, kept, "0,2,4") == before[kept, "safetensors"]
        assert metric(client, COMPUTED) == computed  # the other prompt kept its layers
        assert _hidden(client, pruned, "0,2,4") == before[pruned, "safetensors"]  # this server had the old manifest
        assert metric(client, COMPUTED) == computed + 1  # recomputed once, bit-identical
        assert _hidden(client, pruned, "0,2,4", "pieces") == before[pruned, "pieces"]
        _hidden(client, pruned, "4")
        assert metric(client, COMPUTED) == computed + 1  # and only once


def test_prune_refuses_what_it_cannot_do(tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store) as client:
        register_ready(client, [{"token_ids": list(range(3, 30))}])
    argv = ["prune", "--store", str(store), "--keep-layers"]
    assert main([*argv, "1", "--prompts", "a", "--set", "b"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main([*argv, "1", "--set", "nope"]) == 2
    assert "no set named 'nope'" in capsys.readouterr().err
    assert main([*argv, ""]) == 2
    assert "at least one layer" in capsys.readouterr().err
    assert main([*argv, "1", "--namespace", "other"]) == 2
    assert "name one namespace" in capsys.readouterr().err
