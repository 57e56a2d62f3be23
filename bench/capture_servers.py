"""Capture throughput of 1, 2 and 3 `cache-server serve` processes sharing one store and one
coordination database, side by side in one run.

Run from the repository root: `.venv/bin/python -m bench.capture_servers [--prompts 48]
[--max-new-tokens 32] [--backend local|s3]`.
Each round starts the servers on a fresh store (a local directory and a SQLite file by default; with
`--backend s3`, a prefix in moto's S3 on loopback and a Postgres database), registers the same
prompts through the first server, and times registration to the last prompt ready. The target is a
tiny random model on CPU, so the servers share this machine's cores: each server's torch gets
`--server-threads` of them (OMP_NUM_THREADS, default 1), standing in for a GPU of its own; with
more servers than cores they compete, as they would not on a node with one GPU per server.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from testing.fleet import Fleet
from testing.postgres import fresh_database, postgres_server
from testing.s3 import aws_environment, fresh_prefix, moto_server
from testing.servers import server_metric


def run(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    os.environ["OMP_NUM_THREADS"] = str(args.server_threads)  # the servers inherit it
    with tempfile.TemporaryDirectory(prefix="capture-bench-") as tmp, ExitStack() as stack:
        model = build_tiny_model(Path(tmp) / "target", layers=args.layers, hidden=args.hidden, vocab=512, seed=0)
        if args.backend == "s3":
            stack.enter_context(aws_environment(stack.enter_context(moto_server(Path(tmp) / "moto.log"))))
            postgres = stack.enter_context(postgres_server())
        prompts = [{"token_ids": [5 + i % 7, 11 + i % 400, 3, 40 + i % 13]} for i in range(args.prompts)]
        rows = []
        for n in (1, 2, 3):
            if args.backend == "s3":
                store, db = fresh_prefix(), fresh_database(postgres, f"b_{uuid.uuid4().hex[:12]}")
            else:
                store, db = str(Path(tmp) / f"store-{n}"), str(Path(tmp) / f"store-{n}.sqlite")
            logs = Path(tmp) / f"logs-{n}"
            logs.mkdir()
            fleet = Fleet(model, store, db, logs, ("--batch-tokens", str(args.batch_tokens)))
            try:
                urls = [fleet.start(f"s{i}", wait=False) for i in range(n)]
                fleet.wait_all()
                with CacheClient(urls[0]) as client:
                    t0 = time.perf_counter()
                    ids = [p.prompt_id for p in client.register(prompts, max_new_tokens=args.max_new_tokens)]
                    client.wait_ready(ids, timeout_s=1800, poll_s=0.05)
                    wall = time.perf_counter() - t0
                computed = [int(server_metric(u, "cache_server_prompts_computed_total")) for u in urls]
            finally:
                fleet.stop()
            rows.append((n, wall, computed))
    print(
        f"capture of {args.prompts} prompts ({args.max_new_tokens} generated tokens each) by a "
        f"{args.layers}-layer H={args.hidden} target on CPU, {args.backend} store, {args.server_threads} torch "
        f"thread(s) per server; {os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print(f"{'servers':>8}{'s':>9}{'prompts/s':>11}{'x 1 server':>12}  computed per server")
    for n, wall, computed in rows:
        print(f"{n:>8}{wall:>9.1f}{args.prompts / wall:>11.2f}{rows[0][1] / wall:>12.2f}  {computed}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=32)
    p.add_argument("--batch-tokens", dest="batch_tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--backend", choices=["local", "s3"], default="local")
    p.add_argument("--server-threads", dest="server_threads", type=int, default=1)
    run(p.parse_args())


if __name__ == "__main__":
    main()
