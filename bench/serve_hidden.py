"""`GET /hidden` throughput side by side with its physical limits: a raw loopback socket and plain files.

Run from the repository root: `.venv/bin/python -m bench.serve_hidden [--hidden 5120] [--tokens 2048]
[--dtype bfloat16] [--repeats 9]`.
One prompt's layers (5 by default) are seeded into a temporary store under a bench fixture target (no
model runs) and served by a real uvicorn process on uvloop, as `cache-server serve` runs. The two
halves are also timed apart: the store read (`hidden_body` in-process) and the HTTP transfer (the same
body served from RAM by a bench-only route); `/hidden` itself streams, overlapping the two. A second
server has `--ram-cache-gb`, a third `--no-stream-hidden` (one buffer). Every row but the 128-row
range moves the same bytes; each is the median of `--repeats` interleaved rounds after two warm-up
rounds. Then first-byte latency, and the aggregate throughput of 1, 2 and 4 clients each on its own
prompt.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
import torch
import uvicorn
from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from bench.activations import activation_like
from cache_server.api.app import create_app
from cache_server.api.bodies import hidden_body
from cache_server.client import CacheClient
from cache_server.compute.metrics import Metrics
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.compute.service import HiddenStateService
from cache_server.coordination.database import Database
from cache_server.settings import ServeSettings
from cache_server.store import chunks
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.ram_cache import RamCache
from cache_server.torch_utils import TORCH_DTYPES as DTYPES
from schemas.dtypes import DTypeName
from schemas.model import TargetDescription
from schemas.prompts import CaptureInfo
from schemas.safetensors_frame import parse
from testing.servers import free_port, running_child

REPO = Path(__file__).resolve().parents[1]
FIXTURE_LAYERS = 64
RAM_ROUTE = "/bench/hidden-from-ram"
# Row names of the printed table.
LIMIT = "limit:"
STORE = "store read: hidden_body in-process (decode into the body)"
RAM, E2E = "HTTP from RAM", "GET /hidden"
HTTP, TOTAL = f"{RAM}: CacheClient.get_body", f"{E2E}: CacheClient.hidden pieces (decoded by the client)"
OUT = f"{E2E}: CacheClient.hidden pieces, out= a reused array"
RAM_HIT = f"{E2E}: CacheClient.hidden, --ram-cache-gb hit"
ONE_BUFFER = f"{E2E} --no-stream-hidden: CacheClient.hidden safetensors"
PLAIN = f"{E2E}: CacheClient.hidden safetensors (decoded on the server)"
RANGE = f"{E2E}: CacheClient.hidden rows 960:1088 (128 rows)"
# The same layers written as before block checksums (whole reads check each chunk's crc32, ranges nothing).
OLDER = "(older array, no block checksums)"
STORE_OLD = f"store read: hidden_body in-process {OLDER}"
STORE_RANGE, STORE_RANGE_OLD = "store read: rows 960:1088 in-process", f"store read: rows 960:1088 {OLDER}"
TOTAL_OLD = f"{E2E}: CacheClient.hidden pieces {OLDER}"


# -- the fixture: a target that only has `.info`, and one stored prompt -------------------------


@dataclass(frozen=True)
class NoCapture:
    """Stands in for a `Capturer`: nothing is ever computed."""

    layers: None = None

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class NoTokenizer:
    """Stands in for the tokenizer: `GET /model` reads its chat template's hash only."""

    chat_template_sha256: str | None = None


@dataclass(frozen=True)
class FixtureTarget:
    """Stands in for `Target`: serving a stored prompt only reads `.info`; nothing is ever computed."""

    info: TargetDescription
    prompts: NoTokenizer = NoTokenizer()
    capturer: NoCapture = NoCapture()
    forward: None = None


def fixture_info(hidden: int, dtype: DTypeName) -> TargetDescription:
    return TargetDescription(
        name="bench-fixture",
        fingerprint=f"bench-fixture-h{hidden}-{dtype}",
        num_layers=FIXTURE_LAYERS,
        hidden_size=hidden,
        vocab_size=32000,
        max_position_embeddings=1 << 20,
        dtype=dtype,
        capture=CaptureInfo.model_validate({"kind": "hf", "dtype": dtype}),
    )


def open_store(root: Path | str, info: TargetDescription, read_threads: int, ram_cache_gb: float = 0.0) -> HiddenStore:
    return HiddenStore(
        root,
        fingerprint=info.fingerprint,
        model_name=info.name,
        hidden_size=info.hidden_size,
        dtype=DTYPES[info.dtype],
        read_threads=read_threads,
        ram_cache=RamCache(int(ram_cache_gb * 2**30)) if ram_cache_gb else None,
    )


def seed(
    root: Path | str, db: str, bins: Path, info: TargetDescription, layers: list[int], tokens: int, prompts: int
) -> list[str]:
    """Publish `prompts` prompts' layers and register them (so the service serves them without
    computing); also write the first one's raw layer bytes as `<k>.bin` for the plain-file baseline."""
    pids = []
    bins.mkdir()
    registry = Registry(Database(db), info.fingerprint)
    with open_store(root, info, read_threads=1) as store:
        for i in range(prompts):
            gen = torch.Generator().manual_seed(i)
            ids = tuple(int(t) for t in torch.randint(0, info.vocab_size, (tokens,), generator=gen))
            pid = prompt_id_for(ids, None, None)
            data = {k: activation_like(tokens, info.hidden_size, DTYPES[info.dtype], seed=100 * i + k) for k in layers}
            store.write(pid, np.asarray(ids, dtype=np.int64), tokens, data)
            registry.add_many(
                [Registration(prompt_id=pid, prompt_ids=ids, response_ids=None, max_new_tokens=None, name="bench")]
            )
            pids.append(pid)
            if i == 0:
                for k, t in data.items():
                    (bins / f"{k}.bin").write_bytes(t.view(torch.uint8).numpy().tobytes())
                first = data
        # Last, prompt 0's layers as an older writer stored them (other token ids: another prompt).
        older = tuple(range(tokens))
        pid = prompt_id_for(older, None, None)
        with written_before_block_checksums():
            store.write(pid, np.asarray(older, dtype=np.int64), tokens, first)
        registry.add_many(
            [Registration(prompt_id=pid, prompt_ids=older, response_ids=None, max_new_tokens=None, name="bench")]
        )
    return [*pids, pid]


@contextmanager
def written_before_block_checksums() -> Iterator[None]:
    """Arrays written meanwhile have no block digests, as before they existed: the baseline of their cost."""
    original = chunks.array_objects
    chunks.array_objects = partial(original, block_digests=False)  # type: ignore[assignment]
    try:
        yield
    finally:
        chunks.array_objects = original  # type: ignore[assignment]


# -- the server subprocess ----------------------------------------------------------------------


def serve(
    store: str, db: str, port: int, hidden: int, dtype: str, read_threads: int, ram_cache_gb: float, stream: bool
) -> None:
    """`--serve`: the real app around the fixture target, plus a route serving a cached body."""
    info = fixture_info(hidden, dtype)

    def build(settings: ServeSettings) -> HiddenStateService:
        store = open_store(settings.store, info, settings.read_threads, ram_cache_gb)
        target: Any = FixtureTarget(info)  # duck-typed stand-in for Target
        return HiddenStateService(target, store, capture_layers=[], metrics=Metrics(), db=Database(db))

    # `model` is never loaded: `build` supplies the target.
    settings = ServeSettings(
        model=Path("unused"), store=store, device="cpu", read_threads=read_threads, stream_hidden=stream
    )
    app = create_app(settings, build=build)
    cached: dict[tuple[str, str], memoryview] = {}

    @app.get(RAM_ROUTE)
    async def hidden_from_ram(request: Request, prompt_id: str, layers: str) -> Response:
        """The /hidden body built once and then sent from RAM: the HTTP transfer alone."""
        if (prompt_id, layers) not in cached:
            service: HiddenStateService = request.app.state.service
            ids = [int(k) for k in layers.split(",")]
            m = await service.ensure(prompt_id, ids)
            body = await run_in_threadpool(hidden_body, service.store, m, ids, 0, m.num_tokens)
            cached[prompt_id, layers] = body.as_memoryview()
        return Response(content=cached[prompt_id, layers], media_type="application/octet-stream")

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", log_level="warning")


def bench_server(
    args: argparse.Namespace, store: Path | str, db: str, log: Path, ram_cache_gb: float = 0.0, stream: bool = True
) -> AbstractContextManager[str]:
    """`python -m bench.serve_hidden --serve ...` on a free loopback port; yields its URL, stopped on exit."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.serve_hidden", "--serve", "--store", str(store), "--db", db]
    cmd += ["--port", str(port), "--hidden", str(args.hidden), "--dtype", args.dtype]
    cmd += ["--read-threads", str(args.read_threads), "--ram-cache-gb", str(ram_cache_gb)]
    cmd += [] if stream else ["--no-stream"]
    return running_child(cmd, port, log, cwd=REPO)


# -- the measured paths: each is a callable doing one transfer -----------------------------------


def interleaved_medians(paths: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per path, timing one run of every path per round, so that load from anything
    else on the machine spreads over all paths alike instead of skewing whichever ran then."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(warmup + repeats):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            fn()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


@contextmanager
def raw_socket(nbytes: int, fresh: bool) -> Iterator[Callable[[], None]]:
    """A sender thread sends a preallocated buffer per 1-byte request; we `recv_into` one buffer
    (`fresh`: a new one per transfer, as a client returning the body must allocate)."""
    listener = socket.create_server(("127.0.0.1", 0))
    payload = np.ones(nbytes, dtype=np.uint8)
    reused = bytearray(nbytes)

    def sender() -> None:
        conn, _ = listener.accept()
        with conn:
            while conn.recv(1) == b"x":
                conn.sendall(payload)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    client = socket.create_connection(listener.getsockname())

    def one() -> None:
        sink = memoryview(bytearray(nbytes) if fresh else reused)
        client.sendall(b"x")
        got = 0
        while got < nbytes:
            n = client.recv_into(sink[got:])
            if n == 0:
                raise ConnectionError("sender closed early")
            got += n

    try:
        yield one
    finally:
        client.close()
        thread.join(timeout=10)
        listener.close()


@contextmanager
def plain_files(bins: Path, layers: list[int], threads: int) -> Iterator[Callable[[], None]]:
    """Each layer's `.bin` file `readinto` its region of one preallocated buffer, `threads` at once."""
    paths = [bins / f"{k}.bin" for k in layers]
    sizes = [p.stat().st_size for p in paths]
    offsets = np.cumsum([0, *sizes]).tolist()
    buf = memoryview(bytearray(offsets[-1]))

    def read(i: int) -> None:
        with open(paths[i], "rb", buffering=0) as f:
            view, got = buf[offsets[i] : offsets[i + 1]], 0
            while got < sizes[i]:
                got += f.readinto(view[got:])

    with ThreadPoolExecutor(threads) as pool:
        yield lambda: list(pool.map(read, range(len(paths))))


@contextmanager
def http_client_readinto(url: str, path: str, nbytes: int, fresh: bool) -> Iterator[Callable[[], None]]:
    """stdlib `http.client` reading the body with `readinto` into one buffer reused across requests
    (`fresh`: a new one per request, as `CacheClient` must). One connection per request (~0.2 ms):
    uvicorn drops keep-alive connections idle for 5 s, longer than a round can take."""
    host, port = url.removeprefix("http://").split(":")
    reused = bytearray(nbytes)

    def one() -> None:
        view = memoryview(bytearray(nbytes) if fresh else reused)
        conn = http.client.HTTPConnection(host, int(port))
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            size = int(resp.getheader("Content-Length") or -1)
            if resp.status != 200 or size != nbytes:
                raise RuntimeError(f"{path}: HTTP {resp.status}, {size} bytes")
            got = 0
            while got < size:
                got += resp.readinto(view[got:size])
        finally:
            conn.close()

    yield one


def first_byte_ms(url: str, path: str, repeats: int) -> float:
    """Median time from sending the request to the first byte of the body."""
    host, port = url.removeprefix("http://").split(":")
    times = []
    for _ in range(repeats):
        conn = http.client.HTTPConnection(host, int(port))
        t0 = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read(1)
        times.append(time.perf_counter() - t0)
        conn.close()
    return statistics.median(times) * 1e3


def aggregate_gbps(url: str, pids: list[str], layers: list[int], nbytes: int, repeats: int) -> float:
    """Bytes per second of `len(pids)` clients fetching their own prompt at once (median round)."""
    clients = [CacheClient(url) for _ in pids]
    try:
        with ThreadPoolExecutor(len(pids)) as pool:
            walls = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                list(pool.map(lambda cp: cp[0].hidden(cp[1], layers), zip(clients, pids, strict=True)))
                walls.append(time.perf_counter() - t0)
        return len(pids) * nbytes / statistics.median(walls[1:]) / 1e9
    finally:
        for c in clients:
            c.close()


# -- main ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> None:
    layers = [int(k) for k in args.layers.split(",")]
    info = fixture_info(args.hidden, args.dtype)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="serve-hidden-bench-") as tmp, ExitStack() as stack:
        root, bins = Path(tmp) / "store", Path(tmp) / "bins"
        db = str(Path(tmp) / "coordination.sqlite")
        *pids, old_pid = seed(root, db, bins, info, layers, args.tokens, args.prompts)
        pid = pids[0]
        store = stack.enter_context(open_store(root, info, args.read_threads))
        m, old_m = store.manifest(pid), store.manifest(old_pid)
        if m is None or old_m is None:
            raise RuntimeError(f"the seeded prompts {pid}, {old_pid} are not published")
        nbytes = hidden_body(store, m, layers, 0, m.num_tokens).buffer.nbytes

        url = stack.enter_context(bench_server(args, root, db, Path(tmp) / "server.log"))
        ram_url = stack.enter_context(bench_server(args, root, db, Path(tmp) / "ram.log", 2.0))
        client = stack.enter_context(CacheClient(url))
        ram_client = stack.enter_context(CacheClient(ram_url))
        buffer_url = stack.enter_context(bench_server(args, root, db, Path(tmp) / "s.log", stream=False))
        buffer_client = stack.enter_context(CacheClient(buffer_url))
        ram_client.hidden(pid, layers)  # decoded once, kept
        plain = stack.enter_context(httpx.Client(base_url=url, timeout=120))
        query = {"prompt_id": pid, "layers": ",".join(map(str, layers))}
        hidden_path, ram_path = f"/hidden?{urlencode(query)}", f"{RAM_ROUTE}?{urlencode(query)}"
        out = client.hidden(pid, layers).hidden.copy()  # the caller's reused array for the out= rows
        pieces_nbytes = int(client.get_body("/hidden", {**query, "encoding": "pieces"})[0].nbytes)
        threads = args.read_threads
        paths: dict[str, Callable[[], object]] = {
            f"{LIMIT} raw loopback socket, one buffer": stack.enter_context(raw_socket(nbytes, fresh=False)),
            f"{LIMIT} raw loopback socket, fresh buffer each": stack.enter_context(raw_socket(nbytes, fresh=True)),
            f"{LIMIT} plain .bin files readinto, {threads} threads": stack.enter_context(
                plain_files(bins, layers, threads)
            ),
            STORE: lambda: hidden_body(store, m, layers, 0, m.num_tokens),
            STORE_OLD: lambda: hidden_body(store, old_m, layers, 0, m.num_tokens),
            STORE_RANGE: lambda: hidden_body(store, m, layers, 960, 1088),
            STORE_RANGE_OLD: lambda: hidden_body(store, old_m, layers, 960, 1088),
            HTTP: lambda: parse(client.get_body(RAM_ROUTE, query)[0]),
            f"{RAM}: http.client readinto, fresh buffer each": stack.enter_context(
                http_client_readinto(url, ram_path, nbytes, fresh=True)
            ),
            f"{RAM}: http.client readinto, one buffer": stack.enter_context(
                http_client_readinto(url, ram_path, nbytes, fresh=False)
            ),
            f"{RAM}: httpx .content": lambda: plain.get(ram_path).content,
            TOTAL: lambda: client.hidden(pid, layers),
            TOTAL_OLD: lambda: client.hidden(old_pid, layers),
            OUT: lambda: client.hidden(pid, layers, out=out),
            f"{E2E}: http.client readinto pieces body, one buffer": stack.enter_context(
                http_client_readinto(url, f"{hidden_path}&encoding=pieces", pieces_nbytes, fresh=False)
            ),
            f"{E2E}: http.client readinto, one buffer": stack.enter_context(
                http_client_readinto(url, hidden_path, nbytes, fresh=False)
            ),
            f"{E2E}: httpx .content": lambda: plain.get(hidden_path).content,
            PLAIN: lambda: client.hidden(pid, layers, encoding="safetensors"),
            f"{PLAIN}, out=": lambda: client.hidden(pid, layers, encoding="safetensors", out=out),
            ONE_BUFFER: lambda: buffer_client.hidden(pid, layers, encoding="safetensors"),
            f"{E2E} --no-stream-hidden: http.client readinto, one buffer": stack.enter_context(
                http_client_readinto(buffer_url, hidden_path, nbytes, fresh=False)
            ),
            RAM_HIT: lambda: ram_client.hidden(pid, layers),
            RANGE: lambda: client.hidden(pid, layers, start=960, stop=1088),
        }
        rows = interleaved_medians(paths, args.repeats)
        first_byte = first_byte_ms(url, hidden_path, args.repeats)
        first_byte_buffer = first_byte_ms(buffer_url, hidden_path, args.repeats)
        concurrent = {
            n: aggregate_gbps(url, pids[:n], layers, nbytes, args.repeats) for n in (1, 2, 4) if n <= len(pids)
        }
    report(args, nbytes, layers, load, rows)
    print(f"first byte of GET /hidden: {first_byte:.1f} ms streamed, {first_byte_buffer:.1f} ms one buffer")
    print(
        "aggregate GET /hidden throughput, each client on its own prompt: "
        + ", ".join(f"{n} client(s) {gbps:.2f} GB/s" for n, gbps in concurrent.items())
    )


def report(args: argparse.Namespace, nbytes: int, layers: list[int], load: float, rows: dict[str, float]) -> None:
    raw_s = next(s for name, s in rows.items() if "socket, one buffer" in name)
    files_s = next(s for name, s in rows.items() if "plain .bin" in name)
    print(
        f"GET /hidden body: layers {layers} of [{args.tokens}, {args.hidden}] {args.dtype} = "
        f"{nbytes / 1e6:.1f} MB; median of {args.repeats} interleaved rounds after 2 warm-ups; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at start"
    )
    print(f"{'path':<60}{'ms':>8}{'GB/s':>8}{'x socket':>10}{'x files':>9}")
    for name, s in rows.items():
        gbps = nbytes / s / 1e9
        print(f"{name:<60}{s * 1e3:>8.1f}{gbps:>8.2f}{raw_s / s:>10.2f}{files_s / s:>9.2f}")
    print(
        f"{TOTAL} {rows[TOTAL] * 1e3:.0f} ms vs store read {rows[STORE] * 1e3:.0f} ms "
        f"+ HTTP transfer {rows[HTTP] * 1e3:.0f} ms = {(rows[STORE] + rows[HTTP]) * 1e3:.0f} ms in series; "
        f"a 128-row range costs {rows[RANGE] / rows[TOTAL]:.2f} of the whole"
    )
    print(
        "block checksums, time against the same layers stored without them: "
        f"whole store read {rows[STORE] / rows[STORE_OLD]:.3f}x (crc32 of each chunk before), "
        f"128-row store read {rows[STORE_RANGE] / rows[STORE_RANGE_OLD]:.3f}x (unchecked before), "
        f"pieces end to end {rows[TOTAL] / rows[TOTAL_OLD]:.3f}x (unchecked before)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--layers", default="1,16,31,46,61", help=f"layer ids in 0..{FIXTURE_LAYERS - 1}, request order")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--read-threads", dest="read_threads", type=int, default=4, help="store and file read threads")
    p.add_argument("--prompts", type=int, default=4, help="prompts seeded (the concurrency rows use one each)")
    p.add_argument("--ram-cache-gb", dest="ram_cache_gb", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--no-stream", dest="stream", action="store_false", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(
            args.store, args.db, args.port, args.hidden, args.dtype, args.read_threads, args.ram_cache_gb, args.stream
        )
    else:
        run(args)


if __name__ == "__main__":
    main()
