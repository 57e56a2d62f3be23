"""Many servers, one cache: `cache-server serve` processes sharing one S3 store (moto on loopback) and
one Postgres database, as a scaled-out deployment runs them (one per GPU, on one or many nodes)."""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import create_engine, select

from cache_server.client import CacheClient
from cache_server.coordination.database import database_url
from cache_server.coordination.tables import CAPTURES
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.locations import open_blobs
from testing.fleet import Fleet
from testing.postgres import fresh_database
from testing.s3 import fresh_prefix
from testing.servers import server_metric
from tests.cache_server.published import unpublished
from tests.cache_server.reference import direct_layer_outputs

pytestmark = pytest.mark.slow
LAYERS = "0,3,5"
KILLS_PER_PROMPT = 4  # runs of one prompt killed at most, well below the servers' attempt limit
KILLS = {"local": 20, "s3": 5}  # a local store's writes leave temporary files: where leftovers were found
COMPUTED = "cache_server_prompts_computed_total"


@pytest.fixture
def fleet(tiny_target: Path, tmp_path: Path, s3_env: dict[str, str], postgres_url: str) -> Iterator[Fleet]:
    """No server yet: one fresh S3 prefix and one fresh Postgres database for the test's servers."""
    db = fresh_database(postgres_url, f"t_{uuid.uuid4().hex[:12]}")
    fleet = Fleet(tiny_target, fresh_prefix(), db, tmp_path)
    yield fleet
    fleet.stop()


@pytest.fixture(params=list(KILLS))
def any_fleet(request: pytest.FixtureRequest, tiny_target: Path, tmp_path: Path, postgres_url: str) -> Iterator[Fleet]:
    """`fleet` on an S3 prefix, and on a local directory (whose writes are renames: temporary files)."""
    if request.param == "s3":
        yield request.getfixturevalue("fleet")
        return
    fleet = Fleet(
        tiny_target, str(tmp_path / "store"), fresh_database(postgres_url, f"t_{uuid.uuid4().hex[:12]}"), tmp_path
    )
    yield fleet
    fleet.stop()


def register(url: str, n: int, max_new_tokens: int) -> list[str]:
    prompts = [{"token_ids": [5 + i % 7, 11 + i, 3, 40 + i % 13]} for i in range(n)]
    with CacheClient(url) as client:
        return [p.prompt_id for p in client.register(prompts, max_new_tokens=max_new_tokens)]


def hidden(url: str, prompt_id: str, layers: str = LAYERS) -> bytes:
    r = httpx.get(f"{url}/hidden", params={"prompt_id": prompt_id, "layers": layers}, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


def test_three_servers_capture_every_prompt_once_and_serve_the_same_bytes(fleet: Fleet, tiny_target: Path) -> None:
    fleet.extra = ("--batch-tokens", "64")
    urls = [fleet.start(f"s{i}") for i in range(3)]
    ids = register(urls[0], 60, max_new_tokens=8)
    with CacheClient(urls[1]) as client:
        client.wait_ready(ids, timeout_s=300)
        tokens = client.prompt(ids[7]).token_ids
    assert sum(server_metric(u, COMPUTED) for u in urls) == 60
    first = {pid: hidden(urls[0], pid) for pid in ids}
    for url in urls[1:]:
        assert {pid: hidden(url, pid) for pid in ids} == first
    assert tokens is not None
    ref = direct_layer_outputs(tiny_target, tokens)
    with CacheClient(urls[2]) as client:
        served = client.hidden(ids[7], [0, 3, 5]).to_torch()[0]
    assert torch.equal(served, torch.cat([ref[k] for k in (0, 3, 5)], dim=1))
    for i, url in enumerate(urls):  # each names itself
        assert httpx.get(f"{url}/model").json()["instance"] == f"s{i}"
        assert f'cache_server_instance_info{{instance="s{i}"}} 1.0' in httpx.get(f"{url}/metrics").text


def test_a_missing_layer_asked_of_two_servers_at_once_is_computed_once(fleet: Fleet) -> None:
    fleet.extra = ("--capture-layers", "0")
    a, b = fleet.start("a"), fleet.start("b")
    ids = register(a, 3, max_new_tokens=4)
    with CacheClient(b) as client:
        client.wait_ready(ids, timeout_s=120)
    for layer, pid in zip((4, 2, 5), ids, strict=True):
        before = server_metric(a, COMPUTED) + server_metric(b, COMPUTED)
        barrier = threading.Barrier(2)

        def ask(url: str, pid: str = pid, layer: int = layer, barrier: threading.Barrier = barrier) -> bytes:
            barrier.wait()
            return hidden(url, pid, str(layer))

        with ThreadPoolExecutor(2) as pool:
            got_a, got_b = pool.map(ask, (a, b))
        assert got_a == got_b
        assert server_metric(a, COMPUTED) + server_metric(b, COMPUTED) == before + 1


def _read_while_killing(
    fleet: Fleet, ids: list[str], seen: dict[str, tuple[bytes, datetime]], errors: list[str], stop: threading.Event
) -> None:
    """Fetches every ready prompt from a random live server, over and over: each must always be the
    bytes first seen for it (nothing half-written is ever served)."""
    rng = random.Random(0)
    while not stop.is_set():
        try:
            live = [url for _, url in list(fleet.procs.values())]
        except RuntimeError:  # the main thread started or killed one meanwhile
            continue
        for pid in ids:
            try:
                r = httpx.get(f"{rng.choice(live)}/hidden", params={"prompt_id": pid, "layers": LAYERS}, timeout=10)
            except httpx.TransportError:
                continue  # killed, or not started yet
            if r.status_code == 200:
                first = seen.setdefault(pid, (r.content, datetime.now(UTC)))[0]
                if r.content != first:
                    errors.append(f"{pid}: served other bytes than before")
            elif r.status_code != 503:  # 503: still pending after the server's wait
                errors.append(f"{pid}: HTTP {r.status_code} {r.text[:200]}")
        stop.wait(0.2)


def test_servers_killed_mid_capture_lose_nothing_and_compute_nothing_twice(any_fleet: Fleet) -> None:
    fleet = any_fleet
    fleet.extra = ("--batch-tokens", "72", "--capture-lease-s", "2", "--wait-s", "1")
    for i in range(3):
        fleet.start(f"s{i}")
    kills = KILLS["s3" if fleet.store.startswith("s3://") else "local"]
    ids = register(fleet.url("s0"), max(60, 10 * kills), max_new_tokens=32)  # enough running captures to kill
    engine = create_engine(database_url(fleet.db))
    seen: dict[str, tuple[bytes, datetime]] = {}
    errors: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(target=_read_while_killing, args=(fleet, ids, seen, errors, stop), daemon=True)
    reader.start()
    killed: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while len(killed) < kills:
            assert time.monotonic() < deadline, f"only {len(killed)} kills before the captures ran out"
            with engine.connect() as c:  # a server that holds a running capture right now, of a prompt not
                # near its attempt limit: servers give up on a prompt whose every run died (10 attempts), and
                # on a loaded CPU the same oldest prompt can be the one running at kill after kill
                running = (CAPTURES.c.status == "running") & (CAPTURES.c.attempts < KILLS_PER_PROMPT)
                owners = set(c.scalars(select(CAPTURES.c.owner).where(running)))
            victims = sorted(owners & set(fleet.procs))
            if not victims:
                time.sleep(0.1)
                continue
            fleet.kill(victims[0])
            killed.append(victims[0])
            fleet.start(f"r{len(killed)}", wait=False)  # a replacement, under a new name
        live = fleet.wait_all()
        with CacheClient(live[0]) as client:
            client.wait_ready(ids, timeout_s=300)
        deadline = time.monotonic() + 60  # the reader's sweeps reach every prompt, all ready now
        while set(seen) != set(ids) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        reader.join(timeout=60)
    assert errors == []
    assert set(seen) == set(ids)
    with engine.connect() as c:
        rows = c.execute(select(CAPTURES.c.status, CAPTURES.c.published)).all()
    assert len(rows) == len(ids) and all(r.status == "done" and r.published for r in rows)
    # Every prompt was published once: its manifest is the one that existed when it was first served.
    info = httpx.get(f"{live[0]}/model").json()
    with HiddenStore(
        fleet.store,
        fingerprint=info["fingerprint"],
        model_name=info["name"],
        hidden_size=64,
        dtype=torch.float32,
        orphan_grace_s=3600,
    ) as store:
        for pid in ids:
            m = store.manifest(pid)
            assert m is not None and datetime.fromisoformat(m.created_at) <= seen[pid][1]
    for pid in ids[::6]:
        assert {hidden(url, pid) for url in live} == {seen[pid][0]}
    log_text = "".join(p.read_text() for p in fleet.logs.glob("*.log"))
    assert not re.search(r"Traceback|StoreCorrupt", log_text.replace("SIGKILL", "")), log_text[-3000:]
    fleet.stop()  # then a recovery run: a start that sweeps orphans of any age leaves nothing unpublished
    blobs, namespace = open_blobs(fleet.store), info["fingerprint"]
    left = unpublished(blobs, namespace)
    with HiddenStore(
        blobs, fingerprint=namespace, model_name=info["name"], hidden_size=64, dtype=torch.float32, orphan_grace_s=0
    ) as store:
        swept = store.swept.result()
    assert unpublished(blobs, namespace) == {}, swept
    print(
        f"{len(killed)} kills: {len(left)} unpublished objects ({sum(left.values())} bytes) swept: {sorted(left)[:8]}"
    )
