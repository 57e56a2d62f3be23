"""One coordination-database role of the `bench.coordination` fleet, run in its own process against a
given source tree (put first on PYTHONPATH), so the same driver times the code before and after a
change: `setup` queues the captures, `claim` is one server taking them (claim, then done) until none
is left, `page` is the `/prompts` page's database reads (the registrations caught up, every
prompt's capture state), timed until no capture is left. Each prints one line of JSON."""

from __future__ import annotations

import json
import sys
import time

from cache_server.compute.registry import Registration, Registry
from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database

NAMESPACE = "bench"


def setup(db: Database, prompts: int) -> dict[str, float]:
    """Register `prompts` prompts and queue a capture of each."""
    ids = [f"p{i:06d}" for i in range(prompts)]
    regs = [Registration(prompt_id=p, prompt_ids=(1, 2, 3), response_ids=None, max_new_tokens=8) for p in ids]
    Registry(db, NAMESPACE).add_many(regs)
    CaptureQueue(db, NAMESPACE, "setup").request_many({p: [0, 1] for p in ids})
    return {"prompts": prompts}


def claim(db: Database, owner: str, start_at: float) -> dict[str, float]:
    """Claim and finish captures until none is left: how many, and when the last one ended."""
    captures = CaptureQueue(db, NAMESPACE, owner)
    time.sleep(max(0.0, start_at - time.time()))
    done = 0
    while (claimed := captures.claim()) is not None:
        done += captures.done(claimed.prompt_id)
    return {"claims": done, "ended_at": time.time()}


def page(db: Database, start_at: float) -> dict[str, float]:
    """Time the `/prompts` page's reads while the claimers run; their latencies in ms."""
    registry, captures = Registry(db, NAMESPACE), CaptureQueue(db, NAMESPACE, "reader")
    registry.all()  # a running server has caught up already
    time.sleep(max(0.0, start_at - time.time()))
    latencies: list[float] = []
    while True:
        t0 = time.perf_counter()
        registry.all()
        states = captures.states()
        latencies.append((time.perf_counter() - t0) * 1e3)
        if not any(s.status in ("queued", "running") for s in states.values()):
            break
    latencies.sort()
    return {"p50_ms": latencies[len(latencies) // 2], "p99_ms": latencies[int(len(latencies) * 0.99)]}


def main() -> None:
    role, location, *rest = sys.argv[1:]
    db = Database(location)
    try:
        if role == "setup":
            result = setup(db, int(rest[0]))
        elif role == "claim":
            result = claim(db, rest[0], float(rest[1]))
        else:
            result = page(db, float(rest[0]))
    finally:
        db.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
