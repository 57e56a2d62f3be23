"""A cache server with many registered prompts: time to healthy, listing pages, a job on "all", a claim.

Run from the repository root: `.venv/bin/python -m bench.many_prompts [--prompts 10000]`.
The store is filled directly (registrations plus one stored layer per prompt, as the server writes
them), then a real `cache-server serve` process starts on it. None of the timed requests may read
every manifest: the server reads them once when it starts.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from cache_server.capture.fingerprint import target_fingerprint
from cache_server.capture.tiny_model import build_tiny_model
from cache_server.compute.instances import DEFAULT_DB_FILE
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.coordination.database import Database
from cache_server.store.hidden_store import HiddenStore
from testing.servers import free_port, running_child, serve_command

TOKENS = 8


def fill(store_dir: Path, model: Path, n: int) -> None:
    """`n` registered prompts of TOKENS tokens, each with layer 0 stored (layer 0 of the tiny target)."""
    fingerprint = target_fingerprint(model, "float32")
    with HiddenStore(
        store_dir, fingerprint=fingerprint, model_name=model.name, hidden_size=64, dtype=torch.float32
    ) as store:
        registry = Registry(Database(str(store_dir / DEFAULT_DB_FILE)), fingerprint)  # the server's default database
        layer = torch.zeros(TOKENS, 64)
        for i in range(n):
            ids = tuple(int(x) for x in np.random.default_rng(i).integers(3, 400, TOKENS))
            reg = Registration(
                prompt_id=prompt_id_for(ids, None, None), prompt_ids=ids, response_ids=None, max_new_tokens=None
            )
            registry.add_many([reg])
            store.write(reg.prompt_id, np.asarray(ids), TOKENS, {0: layer}, greedy_mismatches=0)


def median_ms(fn: object, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=10000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = build_tiny_model(tmp / "target", layers=2, hidden=64, vocab=512)
        (tmp / "runs").mkdir()
        torch.save({"model_state_dict": {}}, tmp / "runs" / "c.pt")
        t0 = time.perf_counter()
        fill(tmp / "store", model, args.prompts)
        print(f"filled the store with {args.prompts} prompts in {time.perf_counter() - t0:.1f} s")
        port = free_port()
        extra = ("--capture-layers", "0", "--checkpoint-root", str(tmp / "runs"))
        cmd = serve_command(model, tmp / "store", port, *extra)
        started = time.perf_counter()
        with running_child(cmd, port, tmp / "server.log") as url, httpx.Client(base_url=url, timeout=60) as http:
            healthy = time.perf_counter() - started
            assert http.get("/prompts", params={"limit": 1}).json()["total"] == args.prompts
            requests = [
                ("GET /prompts?limit=1000 (first page)", "GET", "/prompts", {"limit": 1000}),
                ("GET /prompts?offset=9000&limit=1000", "GET", "/prompts", {"offset": 9000, "limit": 1000}),
                ("GET /prompts?status=ready&limit=100", "GET", "/prompts", {"status": "ready", "limit": 100}),
                ("GET /prompts?status=failed (none)", "GET", "/prompts", {"status": "failed"}),
                ("POST /jobs {prompts: all}", "POST", "/jobs", {"checkpoint": "c.pt"}),
                ("POST /jobs/claim (resolves all to ids)", "POST", "/jobs/claim", {"worker": "w", "lease_s": 60}),
            ]
            rows = [("start to healthy (loads the target, reads every manifest once)", healthy * 1e3)]
            for name, method, path, body in requests:
                if method == "GET":
                    rows.append((name, median_ms(lambda p=path, b=body: http.get(p, params=b))))
                else:
                    rows.append((name, median_ms(lambda p=path, b=body: http.post(p, json=b))))
            http.post("/jobs", json={"checkpoint": "c.pt"})
            claim = http.post("/jobs/claim", json={"worker": "w", "lease_s": 60})
            if claim.status_code != 200 or len(claim.json()["prompt_ids"]) != args.prompts:
                raise SystemExit(f"a claim of 'all' did not list the {args.prompts} prompts: {claim.text[:200]}")
    print(f"{'with ' + str(args.prompts) + ' prompts':<66} {'ms':>8}")
    for name, ms in rows:
        print(f"{name:<66} {ms:8.1f}")


if __name__ == "__main__":
    main()
