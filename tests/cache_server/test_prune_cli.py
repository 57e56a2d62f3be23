"""`cache-server prune` beside a running server: the set's prompts lose the layers outside the kept
ones, the other prompts keep theirs, and a pruned layer asked for again is recomputed exactly once,
bit-identical, by a server that had read the prompt's old manifest."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.cli import main
from cache_server.client import CacheClient
from cache_server.jobs.queue import JobStore
from testing.servers import running_server, server_metric
from tests.cache_server.helpers import app_client, metric, register_ready
from tests.cache_server.jobs_helpers import spec

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


def test_prune_refuses_to_drop_layers_that_jobs_read(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store) as client:
        [pid] = register_ready(client, [{"token_ids": list(range(3, 30))}])
        namespace = client.get("/model").json()["fingerprint"]
    now = [time.time()]
    jobs = JobStore(store / "coordination.sqlite", now=lambda: now[0])
    done: dict[str, str] = {}
    for name, fingerprint, layers, days_ago in [
        ("old", namespace, [4], 40),
        ("other-target", "f" * 16, [5], 1),
        ("dflash-a", namespace, [0, 2], 1),
    ]:
        now[0] = time.time() - days_ago * 86400
        job = jobs.submit(spec(f"/ckpt/{name}"), checkpoint_relative=name, target_fingerprint=fingerprint)
        leased = jobs.claim("w", lease_s=60)
        assert leased is not None and leased.job.job_id == job.job_id
        jobs.complete(job.job_id, leased.lease, json.dumps({"target_layer_ids": layers}))
        done[name] = job.job_id
    now[0] = time.time()
    again = jobs.submit(spec("/ckpt/dflash-a"), checkpoint_relative="dflash-a", target_fingerprint=namespace)
    unknown = jobs.submit(spec("/ckpt/eagle-b"), checkpoint_relative="eagle-b", target_fingerprint=namespace)
    argv = ["prune", "--store", str(store), "--grace-s", "0", "--keep-layers"]

    assert main([*argv, "1,3"]) == 2
    err = capsys.readouterr().err
    assert "--keep-layers 1,3 leaves out layers that jobs read" in err
    assert f"dflash-a (job {done['dflash-a']}, done): layers [0, 2]" in err
    assert f"dflash-a (job {again.job_id}, queued): layers [0, 2]" in err  # what its checkpoint read when done
    assert f"eagle-b (job {unknown.job_id}, queued): layers not known until a worker loads it" in err
    assert "old" not in err and "other-target" not in err  # done 40 days back; another target's
    assert "--keep-layers 0,1,2,3" in err and "--force" in err
    assert _layers(store, pid) == list(range(6))  # nothing dropped

    assert main([*argv, "0,1,2,3", "--usage-days", "50"]) == 2  # the old job counts too, and eagle-b
    err = capsys.readouterr().err
    assert f"old (job {done['old']}, done): layers [4]" in err and "--keep-layers 0,1,2,3,4" in err
    jobs.delete(unknown.job_id)
    assert main([*argv, "0,1,2,3,5"]) == 0  # every layer that jobs read is kept
    assert _layers(store, pid) == [0, 1, 2, 3, 5]
    assert main([*argv, "1,3", "--force"]) == 0
    assert _layers(store, pid) == [1, 3]
    jobs.close()


@pytest.fixture(scope="module")
def twelve_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("twelve"), layers=12, hidden=64, vocab=512, seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("grace_s", [0.0, 3.0])
def test_prune_beside_a_server_that_read_every_layer(twelve_layers: Path, tmp_path: Path, grace_s: float) -> None:
    store, pruned = tmp_path / "store", "0,2,4,5,6,7,8,9,10,11"
    with running_server(twelve_layers, store) as url:  # no RAM cache: it would serve the decoded copies it holds
        with CacheClient(url) as client:
            ids = [p.prompt_id for p in client.register([{"token_ids": list(range(5 + i, 40 + i))} for i in range(12)])]
            client.wait_ready(ids, timeout_s=120)
        before = {pid: _served(url, pid, pruned) for pid in ids}  # every layer read: its array opened
        computed = server_metric(url, COMPUTED)
        argv = [sys.executable, "-m", "cache_server.cli", "prune", "--store", str(store), "--keep-layers", "1,3"]
        proc = subprocess.Popen([*argv, "--grace-s", str(grace_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if grace_s:  # during the grace: the manifests no longer list them, and the old ones still read whole
            deadline = time.monotonic() + 60
            while proc.poll() is None and not all(_layers(store, pid) == [1, 3] for pid in ids[:1]):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert {pid: _served(url, pid, pruned) for pid in ids} == before
        out, err = (s.decode() for s in proc.communicate(timeout=120))
        assert proc.returncode == 0 and "Traceback" not in out + err, out + err
        assert "dropped     layers [0, 2, 4, 5, 6, 7, 8, 9, 10, 11]" in out and "12 published, 12 pruned" in out
        assert all(_layers(store, pid) == [1, 3] for pid in ids)
        assert server_metric(url, COMPUTED) == computed  # nothing captured again yet
        assert {pid: _served(url, pid, pruned) for pid in ids} == before  # captured again, bit-identical
        assert server_metric(url, COMPUTED) == computed + 12  # once per prompt
        for pid in ids:  # every layer again
            _served(url, pid, "0,1,2,3,4,5,6,7,8,9,10,11")
        assert server_metric(url, COMPUTED) == computed + 12
    assert "Traceback" not in (tmp_path / "store.log").read_text()


def _served(url: str, pid: str, layers: str) -> bytes:
    r = httpx.get(f"{url}/hidden", params={"prompt_id": pid, "layers": layers}, timeout=60)
    assert r.status_code == 200, r.text  # never a 503
    return r.content


def _layers(store: Path, pid: str) -> list[int]:
    """The layers a prompt's manifest lists."""
    manifest = json.loads(next(store.glob(f"*/prompts/{pid}/zarr.json")).read_text())["attributes"]["manifest"]
    return sorted(manifest["layers"])
