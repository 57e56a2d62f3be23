"""`GET /layers/usage`: the layer sets of the jobs done in the last N days, read from their reports;
jobs older, failed or not done are not counted."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from cache_server.jobs.layer_usage import layer_usage
from cache_server.jobs.queue import JobStore
from tests.cache_server.helpers import app_client
from tests.cache_server.jobs_helpers import spec

DAY = 86400.0


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def test_the_layer_sets_of_recent_done_jobs(tmp_path: Path) -> None:
    clock = Clock()
    now = clock.t
    store = JobStore(tmp_path / "jobs.sqlite", now=clock)
    for name, layers, days_ago, ends in [
        ("old", [1, 3, 5], 40, "done"),
        ("a", [1, 3, 5], 2, "done"),
        ("b", [2, 4], 3, "done"),
        ("c", [1, 3, 5], 1, "done"),
        ("failed", [7], 1, "failed"),
        ("queued", [8], 1, "queued"),
    ]:
        job = store.submit(spec(f"/ckpt/{name}"), checkpoint_relative=name)
        if ends == "queued":
            continue
        clock.t = now - days_ago * DAY
        leased = store.claim("w", lease_s=60)
        assert leased is not None and leased.job.job_id == job.job_id
        if ends == "done":
            store.complete(job.job_id, leased.lease, json.dumps({"target_layer_ids": layers}))
        else:
            store.fail(job.job_id, leased.lease, "boom", retryable=False)
    usage = layer_usage(store, since=now - 30 * DAY)
    store.close()
    assert [(s.layers, s.jobs) for s in usage.layer_sets] == [([1, 3, 5], 2), ([2, 4], 1)]
    assert usage.layer_sets[0].last_finished_at == datetime.fromtimestamp(now - DAY, UTC)
    assert usage.layers == [1, 2, 3, 4, 5]


def test_the_route_answers_on_a_server_with_no_jobs(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        body = client.get("/layers/usage", params={"days": 7}).json()
    assert (body["layer_sets"], body["layers"]) == ([], [])
