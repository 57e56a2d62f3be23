"""A prune beside servers that capture: a refill of the pruned prompt (a server capturing its dropped
layers again) started at every step of the prune, held at a barrier just before it publishes, never
loses a layer nor answers 503; and a server that starts during the prune's grace sweeps none of the
files the prune dropped, which the prune deletes once the grace has passed."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import cast

import httpx
from fastapi import FastAPI

from cache_server.api.app import create_app
from cache_server.capture.target import open_hf_target
from cache_server.compute.instances import DEFAULT_DB_FILE
from cache_server.compute.metrics import Metrics
from cache_server.compute.service import HiddenStateService
from cache_server.coordination.database import Database
from cache_server.coordination.holds import PromptHolds
from cache_server.settings import ServeSettings
from cache_server.store.blobs import LocalBlobs
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.prune import open_namespace, prune
from cache_server.torch_utils import TORCH_DTYPES
from testing.servers import serving_app
from tests.cache_server.helpers import app_client, metric, register_ready, serve_settings
from tests.cache_server.published import unpublished

DROPPED, ALL = "0,2,4,5", "0,1,2,3,4,5"
STEPS = [
    f"{p}:{s}"
    for p, names in (("drop", "hold read published released"), ("delete", "hold read deleted released"))
    for s in names.split()
]


class Barrier:
    """Where a capture waits, just before it publishes a prompt's manifest, until the test opens it."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.reached, self.opened = threading.Event(), threading.Event()
        self.writes: Counter[str | None] = Counter()  # of the barrier's key: a capture publishing the prompt

    def arm(self, key: str) -> None:
        self.key = key
        self.reached.clear()
        self.opened.clear()

    def open(self) -> None:
        self.opened.set()


class BarrierBlobs(LocalBlobs):
    """A local store whose write of the barrier's key waits at the barrier."""

    def __init__(self, root: Path, barrier: Barrier) -> None:
        super().__init__(root)
        self.barrier = barrier

    def put(self, key: str, data: bytes | memoryview, *, create: bool = False) -> None:
        """Waits first if `key` is the barrier's."""
        if key == self.barrier.key:
            self.barrier.writes[key] += 1
            self.barrier.reached.set()
            self.barrier.opened.wait(60)
        super().put(key, data, create=create)


def _service(settings: ServeSettings, barrier: Barrier) -> HiddenStateService:
    """`build_service` of a CPU target, with the barrier in its store's writes."""
    target = open_hf_target(settings.model, device="cpu")
    info = target.info
    blobs = BarrierBlobs(Path(settings.store), barrier)
    # No sweep at its start: it would read, and keep, every manifest; this server reads each prompt's first
    # when the test asks for it.
    shape = {"hidden_size": info.hidden_size, "dtype": TORCH_DTYPES[info.dtype], "orphan_grace_s": math.inf}
    store = HiddenStore(blobs, fingerprint=info.fingerprint, model_name=info.name, **shape)  # type: ignore[arg-type]
    db = Database(str(blobs.root / DEFAULT_DB_FILE))
    return HiddenStateService(target, store, capture_layers=list(range(info.num_layers)), metrics=Metrics(), db=db)


def _arrays(store: Path, pid: str) -> list[int]:
    """The layer arrays a prompt has on disk, listed or not."""
    return sorted(int(p.name) for p in store.glob(f"*/prompts/{pid}/layers/*") if p.is_dir())


def _get(url: str, pid: str, layers: str) -> httpx.Response:
    return httpx.get(f"{url}/hidden", params={"prompt_id": pid, "layers": layers}, timeout=60)


def test_a_refill_at_every_step_of_a_prune_loses_nothing(tiny_target: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    prompts = [{"token_ids": list(range(3 + i, 30 + i))} for i in range(len(STEPS))]
    with app_client(tiny_target, store) as client:  # captures every prompt, then stops
        ids = register_ready(client, prompts)
        before = {
            (pid, ls): bytes(client.get("/hidden", params={"prompt_id": pid, "layers": ls}).content)
            for pid in ids
            for ls in (DROPPED, ALL)
        }
    barrier = Barrier()
    settings = serve_settings(tiny_target, store)
    pruner, db = open_namespace(LocalBlobs(store), None), Database(str(store / DEFAULT_DB_FILE))
    leases = PromptHolds(db, pruner.namespace, "prune")
    with serving_app(create_app(settings, build=lambda s: _service(s, barrier))) as url, pruner:
        for pid, at in zip(ids, STEPS, strict=True):  # a server that never read the prompt refills it
            barrier.arm(f"{pruner.namespace}/prompts/{pid}/zarr.json")
            refill: list[httpx.Response] = []
            thread = threading.Thread(target=lambda pid=pid, out=refill: out.append(_get(url, pid, DROPPED)))
            seen: list[str] = []

            def step(
                name: str, _pid: str, at: str = at, thread: threading.Thread = thread, seen: list[str] = seen
            ) -> None:
                seen.append(name)
                if name == at:  # the refill starts: on to its barrier, or waiting for the prune's lease
                    thread.start()
                    deadline = time.monotonic() + 1.5
                    while not barrier.reached.is_set() and thread.is_alive() and time.monotonic() < deadline:
                        time.sleep(0.02)

            def sleep(seconds: float) -> None:  # the grace, or a wait for the refill's capture lease
                barrier.open()
                time.sleep(seconds)

            result = prune(pruner, [1, 3], [pid], grace_s=0.2, sleep=sleep, leases=leases, step=step, retry_s=0.1)
            barrier.open()
            thread.join(60)
            assert set(seen) == set(STEPS), seen  # every step passed (a busy prompt's hold, more than once)
            assert result.dropped == {pid: (0, 2, 4, 5)} and not result.busy, (at, result)
            assert [r.status_code for r in refill] == [200], (at, [r.text[:300] for r in refill])
            assert refill[0].content == before[pid, DROPPED], at
            manifest = pruner.manifest(pid, fresh=True)
            assert manifest is not None, at
            for k in manifest.layers:  # no layer listed without its files
                assert (store / pruner.namespace / "prompts" / pid / "layers" / str(k) / "zarr.json").exists(), (at, k)
            whole = _get(url, pid, ALL)
            assert whole.status_code == 200 and whole.content == before[pid, ALL], (at, whole.text[:300])
            manifest = pruner.manifest(pid, fresh=True)
            assert manifest is not None and manifest.layers == (0, 1, 2, 3, 4, 5), at
            # The dropped layers, captured once (counted here: /metrics would have the server read, and keep,
            # every manifest, and it must read each prompt's first when the refill asks for it).
            assert barrier.writes[barrier.key] == 1, at
    db.close()
    assert unpublished(LocalBlobs(store), pruner.namespace) == {}


def test_a_server_starting_during_the_grace_leaves_the_dropped_files(tiny_target: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store) as client:
        ids = register_ready(client, [{"token_ids": list(range(3, 30 + i))} for i in range(3)])
        before = {pid: bytes(client.get("/hidden", params={"prompt_id": pid, "layers": ALL}).content) for pid in ids}
        computed = metric(client, "cache_server_prompts_computed_total")
        pruner, db = open_namespace(LocalBlobs(store), None), Database(str(store / DEFAULT_DB_FILE))
        during = []

        def grace(seconds: float) -> None:
            with app_client(tiny_target, store, orphan_grace_s=0) as starting:  # sweeps orphans of any age
                cast(FastAPI, starting.app).state.service.store.swept.result()
            assert [_arrays(store, pid) for pid in ids] == [
                list(range(6))
            ] * 3  # the prune's to delete, after the grace
            for pid in ids:  # this server read the old manifests: its reads finish
                assert bytes(client.get("/hidden", params={"prompt_id": pid, "layers": ALL}).content) == before[pid]
            during.append(seconds)

        with pruner:
            prune(pruner, [1, 3], grace_s=1, sleep=grace, leases=PromptHolds(db, pruner.namespace, "prune"))
        db.close()
        assert during == [1]
        assert [_arrays(store, pid) for pid in ids] == [[1, 3]] * 3
        assert metric(client, "cache_server_prompts_computed_total") == computed  # nothing captured meanwhile
        for pid in ids:  # asked again: captured once more, the same bytes
            assert bytes(client.get("/hidden", params={"prompt_id": pid, "layers": ALL}).content) == before[pid]
        assert metric(client, "cache_server_prompts_computed_total") == computed + 3
