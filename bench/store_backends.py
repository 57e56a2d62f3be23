"""`GET /hidden` from an S3 store against the same prompt on local disk, side by side in one run.

Run from the repository root: `.venv/bin/python -m bench.store_backends [--hidden 5120] [--tokens 2048]
[--repeats 7]`.
The S3 endpoint is moto's standalone server on loopback (`moto[server]`, in the dev extra): it keeps
objects in its own Python process's memory and answers over HTTP/1.1, so the S3 rows are a floor set
by moto, not a figure for AWS S3 or MinIO. The same prompt (5 layers of [tokens, hidden] bf16 by
default) is seeded into a local store and an S3 prefix and served by two real server processes, as
`bench.serve_hidden` serves it; each row is the median of `--repeats` interleaved rounds after two
warm-ups, through `CacheClient.hidden` (pieces, the default) and plain safetensors.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from bench.serve_hidden import DTYPES, bench_server, fixture_info, interleaved_medians, open_store, seed
from cache_server.api.bodies import hidden_body
from cache_server.client import CacheClient
from testing.s3 import aws_environment, fresh_prefix, moto_server


def run(args: argparse.Namespace) -> None:
    layers = [int(k) for k in args.layers.split(",")]
    info = fixture_info(args.hidden, args.dtype)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="store-backends-bench-") as tmp, ExitStack() as stack:
        env = stack.enter_context(moto_server(Path(tmp) / "moto.log"))
        stack.enter_context(aws_environment(env))  # the servers inherit it
        roots = {"local disk": str(Path(tmp) / "store"), "S3 (moto)": fresh_prefix()}
        dbs = {name: str(Path(tmp) / f"db-{i}.sqlite") for i, name in enumerate(roots)}
        pids = {
            name: seed(root, dbs[name], Path(tmp) / f"bins-{i}", info, layers, args.tokens, 1)[0]
            for i, (name, root) in enumerate(roots.items())
        }
        with open_store(roots["local disk"], info, args.read_threads) as store:
            m = store.manifest(pids["local disk"])
            assert m is not None
            nbytes = hidden_body(store, m, layers, 0, m.num_tokens).buffer.nbytes
        paths: dict[str, Callable[[], object]] = {}
        for name, root in roots.items():
            url = stack.enter_context(bench_server(args, root, dbs[name], Path(tmp) / f"{name.split()[0]}.log"))
            client = stack.enter_context(CacheClient(url))
            pid = pids[name]
            assert client.hidden(pid, layers).hidden.shape == (args.tokens, len(layers) * args.hidden)
            paths[f"{name}: CacheClient.hidden (pieces)"] = lambda c=client, p=pid: c.hidden(p, layers)
            paths[f"{name}: CacheClient.hidden safetensors"] = lambda c=client, p=pid: c.hidden(
                p, layers, encoding="safetensors"
            )
            paths[f"{name}: CacheClient.hidden rows 960:1088"] = lambda c=client, p=pid: c.hidden(
                p, layers, start=960, stop=1088
            )
        rows = interleaved_medians(paths, args.repeats)
    print(
        f"GET /hidden body: layers {layers} of [{args.tokens}, {args.hidden}] {args.dtype} = {nbytes / 1e6:.1f} MB; "
        f"median of {args.repeats} interleaved rounds; {os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print(f"{'path':<52}{'ms':>8}{'GB/s':>8}{'x local':>9}")
    for name, s in rows.items():
        local = rows[name.replace("S3 (moto)", "local disk")]
        gbps = "-" if "rows" in name else f"{nbytes / s / 1e9:.2f}"  # a range moves 1/16 of the bytes
        print(f"{name:<52}{s * 1e3:>8.1f}{gbps:>8}{local / s:>9.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--layers", default="1,16,31,46,61")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--read-threads", dest="read_threads", type=int, default=4)
    run(p.parse_args())


if __name__ == "__main__":
    main()
