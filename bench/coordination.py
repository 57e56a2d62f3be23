"""Claims per second and `/prompts` page latency with 1, 2 and 4 servers on one Postgres, for the code
before a change and after it, side by side in one run.

Run from the repository root: `.venv/bin/python -m bench.coordination [--before REV] [--prompts 1500]`.
`--before` (default: the last commit whose every transaction took one fleet-wide lock) is extracted
with `git archive`; "after" is this working tree. For each, and each fleet size, a fresh database gets
`--prompts` queued captures; that many server processes then claim and finish them (each claim and
each finish a transaction of its own) while one more process reads the `/prompts` page's rows over
and over until the queue is empty. Every process runs `bench/coordination_fleet.py` against the
tree being timed. The servers share this machine's cores with Postgres, so more servers than cores
measure contention, not scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from io import BytesIO
from pathlib import Path

from testing.postgres import fresh_database, postgres_server

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "bench" / "coordination_fleet.py"
SERVERS = (1, 2, 4)


def extract(rev: str, into: Path) -> Path:
    """The source tree of `rev`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def role(tree: Path, *args: str) -> subprocess.Popen[str]:
    """One driver process running `args` against `tree`'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen([sys.executable, str(DRIVER), *args], env=env, stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args} exited {proc.returncode}")
    loaded: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return loaded


def one_round(tree: Path, postgres: str, servers: int, prompts: int) -> tuple[float, float, float]:
    """Claims per second, and the page's p50 and p99 in ms."""
    location = fresh_database(postgres, f"b_{uuid.uuid4().hex[:12]}")
    result(role(tree, "setup", location, str(prompts)))
    start_at = time.time() + 3.0  # every process connected and imported by then
    claimers = [role(tree, "claim", location, f"s{i}", str(start_at)) for i in range(servers)]
    reader = role(tree, "page", location, str(start_at))
    claimed = [result(p) for p in claimers]
    page = result(reader)
    if sum(c["claims"] for c in claimed) != prompts:
        raise RuntimeError(f"{servers} servers claimed {[c['claims'] for c in claimed]} of {prompts} captures")
    wall = max(c["ended_at"] for c in claimed) - start_at
    return prompts / wall, page["p50_ms"], page["p99_ms"]


def run(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="coordination-bench-") as tmp, postgres_server() as postgres:
        trees = {"before": extract(args.before, Path(tmp) / "before"), "after": ROOT}
        rows = {(name, n): one_round(tree, postgres, n, args.prompts) for n in SERVERS for name, tree in trees.items()}
    print(
        f"{args.prompts} captures claimed and finished by N servers on one Postgres (before: {args.before}, "
        f"after: this tree); {os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print(f"{'servers':>8}{'claims/s before':>17}{'after':>8}{'x':>7}{'page p50/p99 ms before':>25}{'after':>14}")
    for n in SERVERS:
        (b, b50, b99), (a, a50, a99) = rows["before", n], rows["after", n]
        print(f"{n:>8}{b:>17.0f}{a:>8.0f}{a / b:>7.2f}{f'{b50:.1f} / {b99:.1f}':>25}{f'{a50:.1f} / {a99:.1f}':>14}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="587bbce", help="the git revision to compare with (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=1500)
    run(p.parse_args())


if __name__ == "__main__":
    main()
