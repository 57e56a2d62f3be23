"""Training samples per second from `HiddenStatesDataset` against the peers' own per-sample files on disk.

Run from the repository root: `.venv/bin/python -m bench.training_feed [--hidden 5120] [--tokens 2048]
[--samples 8] [--repeats 4] [--prefetch 4]`.
Two shapes: the demo target's (8 layers of width 128, float32, as `python -m demo` builds it) and
`--hidden`-wide bfloat16 with 64 layers. Each seeds `--samples` prompts of `--tokens` tokens, EAGLE-3's
default aux layers (1, L/2 - 1, L - 4) and the last (L - 1), without a model, into a local store and an
S3 prefix, each served by a real server process (`bench.serve_hidden`'s fixture target, given heads for
the final norm); moto on loopback holds the S3 objects in memory, so the S3 row is a floor set by moto,
as in `bench.store_backends`. The same states are written as the peers' own files: speculators'
`hs_{i}.safetensors` and SpecForge's `data_{i}.ckpt`, each read as its trainer's dataset reads it.
Rows: one epoch per row per round, iterated in this process (no DataLoader workers; the dataset fetches
`--prefetch` ahead in its threads, and once more 1 ahead; the files are read one after another as
`__getitem__` reads them),
each sample's hidden states then copied once as a collate would (the copy that reads a mapped file);
samples/s, MB/s of hidden-state bytes delivered (aux layers + last) and the ratio to the floor, the
peer's files of the same format. `first/s` is the first epoch after dropping the row's files from the
page cache (fsync + POSIX_FADV_DONTNEED): disk reads. The medians (of `--repeats` interleaved rounds
after those) read page-cached files, as the server reads its page-cached local store. Last, what the
`CacheClient` each dataset epoch opens costs. Each dataset's first sample is checked equal to the file first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import uvicorn
from safetensors.torch import load_file, save_file

from bench.activations import activation_like
from bench.serve_hidden import REPO, FixtureTarget, fixture_info, interleaved_medians, open_store
from cache_server.api.app import create_app
from cache_server.capture.heads import FinalNorm, Heads
from cache_server.client import CacheClient
from cache_server.client.torch_dataset import HiddenStatesDataset, Sample
from cache_server.compute.metrics import Metrics
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.compute.service import HiddenStateService
from cache_server.coordination.database import Database
from cache_server.settings import ServeSettings
from cache_server.torch_utils import TORCH_DTYPES as DTYPES
from eval_worker.checkpoints.layer_ids import eagle3_default_layer_ids
from schemas.dtypes import DTypeName
from schemas.model import TargetDescription
from schemas.sample_formats import SampleFormat
from testing.s3 import aws_environment, fresh_prefix, moto_server
from testing.servers import free_port, running_child

VOCAB = 1024  # the fixture's embed and lm_head are [VOCAB, H]: small, since only the final norm is read
LOCAL, S3 = "local store", "S3 store (moto)"
HIDDEN_KEYS = ("hidden_states", "verifier_last_hidden_states", "hidden_state", "aux_hidden_state")
SPEC_FILE, CKPT_FILE = "speculators/hs_{}.safetensors", "specforge/data_{}.ckpt"
# The floors' row names.
SPECULATORS, SPECFORGE = "floor: speculators' hs_{i}.safetensors, load_file", "floor: SpecForge's data_{i}.ckpt, mmap"


@dataclass(frozen=True)
class Shape:
    """A target's shape as the fixture server describes it, and the layers a sample carries."""

    label: str
    num_layers: int
    hidden: int
    dtype: DTypeName

    def info(self) -> TargetDescription:
        """The fixture target's description at this shape."""
        base = fixture_info(self.hidden, self.dtype)
        return base.model_copy(update={"num_layers": self.num_layers, "vocab_size": VOCAB})

    @property
    def aux(self) -> list[int]:
        """EAGLE-3's default taps as decoder outputs."""
        return list(eagle3_default_layer_ids(self.num_layers))

    @property
    def last(self) -> int:
        """The target's last decoder output."""
        return self.num_layers - 1


@dataclass(frozen=True)
class HeadedTarget(FixtureTarget):
    """The fixture target with heads, whose final norm `final_norm=post` (SpecForge EAGLE-3) applies."""

    heads: Heads = field(kw_only=True)


def fixture_heads(shape: Shape) -> Heads:
    """Seeded heads: the server process and the bench's SpecForge files build the same final norm."""
    gen = torch.Generator().manual_seed(shape.hidden)
    dtype = DTYPES[shape.dtype]
    embed = torch.randn(VOCAB, shape.hidden, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape.hidden, generator=gen)).to(dtype)
    return Heads(embed, embed, FinalNorm(weight, 1e-6))


# -- the server subprocess ----------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    """`--serve`: the real app around the fixture target with heads, on loopback."""
    shape = Shape("served", args.num_layers, args.hidden, args.dtype)
    info = shape.info()

    def build(settings: ServeSettings) -> HiddenStateService:
        store = open_store(settings.store, info, settings.read_threads)
        target: Any = HeadedTarget(info, heads=fixture_heads(shape))  # duck-typed stand-in for Target
        return HiddenStateService(target, store, capture_layers=[], metrics=Metrics(), db=Database(args.db))

    # `model` is never loaded: `build` supplies the target.
    settings = ServeSettings(model=Path("unused"), store=args.store, device="cpu", read_threads=args.read_threads)
    uvicorn.run(create_app(settings, build=build), host="127.0.0.1", port=args.port, loop="uvloop", log_level="warning")


def feed_server(shape: Shape, store: str, db: str, log: Path, read_threads: int) -> AbstractContextManager[str]:
    """`python -m bench.training_feed --serve ...` on a free loopback port; yields its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.training_feed", "--serve", "--store", store, "--db", db]
    cmd += ["--port", str(port), "--hidden", str(shape.hidden), "--num-layers", str(shape.num_layers)]
    cmd += ["--dtype", shape.dtype, "--read-threads", str(read_threads)]
    return running_child(cmd, port, log, cwd=REPO)


# -- the samples: one set of states, in the stores and in the peers' files -----------------------


def seed(roots: Iterable[tuple[str, str]], files: Path, shape: Shape, tokens: int, samples: int) -> list[str]:
    """Publish and register `samples` prompts in every (store root, database), and write each as the
    peers' files under `files`; the prompt ids, in order."""
    info, layers, pids = shape.info(), [*shape.aux, shape.last], []
    with ExitStack() as stack:
        stores = [
            (stack.enter_context(open_store(r, info, 1)), Registry(Database(db), info.fingerprint)) for r, db in roots
        ]
        for i in range(samples):
            ids = torch.randint(0, VOCAB, (tokens,), generator=torch.Generator().manual_seed(i))
            data = {k: activation_like(tokens, shape.hidden, DTYPES[shape.dtype], seed=100 * i + k) for k in layers}
            pid = prompt_id_for(tuple(ids.tolist()), None, None)
            reg = Registration(prompt_id=pid, prompt_ids=tuple(ids.tolist()), response_ids=None, max_new_tokens=None)
            for store, registry in stores:
                store.write(pid, ids.numpy(), tokens, data)  # all prompt: the loss mask is all 0
                registry.add_many([reg])
            write_peer_files(files, i, ids, data, shape)
            pids.append(pid)
    return pids


def write_peer_files(files: Path, i: int, ids: torch.Tensor, data: dict[int, torch.Tensor], shape: Shape) -> None:
    """Sample `i` as speculators' `hs_{i}.safetensors` (hidden_states [T, k+1, H], aux then last) and
    SpecForge's `data_{i}.ckpt` (hidden_state [1, T, H] after the final norm, aux_hidden_state [1, T, kH])."""
    aux, last = [data[k] for k in shape.aux], data[shape.last]
    save_file({"hidden_states": torch.stack([*aux, last], dim=1), "token_ids": ids}, files / SPEC_FILE.format(i))
    norm = fixture_heads(shape).final_norm
    if norm is None:
        raise RuntimeError("fixture heads without a final norm")
    ckpt = {
        "input_ids": ids,
        "loss_mask": torch.zeros_like(ids),
        "hidden_state": norm(last)[None],
        "aux_hidden_state": torch.cat(aux, dim=1)[None],
    }
    torch.save(ckpt, files / CKPT_FILE.format(i))


def read_speculators(path: Path) -> Sample:
    """As speculators' ArrowDataset: hs_connectors' `load_file`, then the aux layers flattened and the last
    (the file is mapped and both are views of it: nothing is read yet)."""
    hs = load_file(path)
    return {
        "hidden_states": hs["hidden_states"][:, :-1].flatten(1),
        "input_ids": hs["token_ids"],
        "verifier_last_hidden_states": hs["hidden_states"][:, -1],
    }


def read_specforge(path: Path) -> Sample:
    """As SpecForge's OfflineEagle3Dataset: `torch.load(mmap=True)`, which maps the file and reads nothing."""
    data: Sample = torch.load(path, weights_only=False, mmap=True)
    return data


def delivered(samples: Iterable[Sample]) -> int:
    """Each sample's hidden states (aux layers and last) copied once into fresh memory, as a trainer's
    collate stacks them into a batch (for mapped files, also what reads them); their bytes."""
    return sum(s[k].clone().nbytes for s in samples for k in HIDDEN_KEYS if k in s)


# -- the rows ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One measured path: an epoch returning the hidden bytes it delivered, the floor it is compared
    with, and the directory whose page cache is dropped before its first epoch."""

    epoch: Callable[[], int]
    floor: str
    cold: Path | None


def drop_page_cache(root: Path) -> None:
    """Evict `root`'s files from the page cache (written back first), so that the next read is from disk."""
    for path in (p for p in root.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def first_epochs(rows: dict[str, Row]) -> dict[str, tuple[float, int]]:
    """Each row's first epoch (cold where it has files to drop): seconds and hidden bytes delivered."""
    first = {}
    for name, row in rows.items():
        if row.cold is not None:
            drop_page_cache(row.cold)
        t0 = time.perf_counter()
        nbytes = row.epoch()
        first[name] = (time.perf_counter() - t0, nbytes)
    return first


def check_same_states(datasets: Iterable[HiddenStatesDataset], files: Path, pid: str) -> None:
    """The first prompt as each dataset delivers it equals the peer's file of its format (so every row
    moves the same states); RuntimeError naming the tensor that differs."""
    for data in datasets:
        with CacheClient(data.server) as client:
            got = data.sample_of(client, pid)
        spec = data.format == "speculators"
        want = read_speculators(files / SPEC_FILE.format(0)) if spec else read_specforge(files / CKPT_FILE.format(0))
        for key in (k for k in HIDDEN_KEYS if k in want):
            if not torch.equal(got[key], want[key]):
                raise RuntimeError(f"{data.format} {key} from {data.server} differs from the peer's file")


def dataset_row(data: HiddenStatesDataset, cold: Path | None) -> Row:
    """An epoch of the dataset, compared with the peer's files of its format."""
    return Row(partial(delivered, data), SPECULATORS if data.format == "speculators" else SPECFORGE, cold)


def floor_rows(files: Path, samples: int) -> dict[str, Row]:
    """The peers' files read as their datasets read them, one after another."""
    spec_paths = [files / SPEC_FILE.format(i) for i in range(samples)]
    ckpt_paths = [files / CKPT_FILE.format(i) for i in range(samples)]
    return {
        SPECULATORS: Row(lambda: delivered(map(read_speculators, spec_paths)), SPECULATORS, files / "speculators"),
        SPECFORGE: Row(lambda: delivered(map(read_specforge, ckpt_paths)), SPECFORGE, files / "specforge"),
    }


# -- main ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One shape's rows, first epochs (seconds, bytes) and medians (seconds)."""

    rows: dict[str, Row]
    first: dict[str, tuple[float, int]]
    medians: dict[str, float]
    client_start_s: float


def bench_shape(args: argparse.Namespace, shape: Shape, work: Path) -> Measured:
    """Seed, serve and time one shape's rows."""
    files = work / "files"
    for sub in ("speculators", "specforge"):
        (files / sub).mkdir(parents=True)
    roots = {LOCAL: str(work / "store"), S3: fresh_prefix()}
    dbs = {name: str(work / f"db-{i}.sqlite") for i, name in enumerate(roots)}
    pids = seed([(roots[n], dbs[n]) for n in roots], files, shape, args.tokens, args.samples)
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(feed_server(shape, roots[n], dbs[n], work / f"server-{i}.log", args.read_threads))
            for i, n in enumerate(roots)
        }
        wanted: list[tuple[str, SampleFormat, int]] = [
            (LOCAL, "speculators", args.prefetch),
            (LOCAL, "speculators", 1),  # one request in flight: no threads contending for the cores
            (LOCAL, "specforge-eagle3", args.prefetch),
            (S3, "speculators", args.prefetch),
        ]
        datasets = {
            f"HiddenStatesDataset, {n}, {fmt}, prefetch {k}": HiddenStatesDataset(
                urls[n], layers=shape.aux, prompt_ids=pids, format=fmt, prefetch=k
            )
            for n, fmt, k in dict.fromkeys(wanted)  # once, when --prefetch is 1
        }
        check_same_states(datasets.values(), files, pids[0])
        local = work / "store"  # the server reads it from disk on a cold first epoch
        rows = {name: dataset_row(d, local if LOCAL in name else None) for name, d in datasets.items()}
        rows |= floor_rows(files, args.samples)
        first = first_epochs(rows)  # they leave every row's files page-cached: no further warm-up
        medians = interleaved_medians({name: row.epoch for name, row in rows.items()}, args.repeats, warmup=0)
        start = interleaved_medians({"client": lambda: CacheClient(urls[LOCAL]).close()}, args.repeats)["client"]
    return Measured(rows, first, medians, start)


def report(args: argparse.Namespace, shape: Shape, m: Measured) -> None:
    """The shape's table: samples/s of the first (cold) epoch and the median, MB/s, and x its floor."""
    itemsize = DTYPES[shape.dtype].itemsize
    nbytes = args.samples * args.tokens * (len(shape.aux) + 1) * shape.hidden * itemsize
    wrong = {name: got for name, (_, got) in m.first.items() if got != nbytes}
    if wrong:
        raise RuntimeError(f"rows delivered other than {nbytes} hidden-state bytes: {wrong}")
    print(
        f"\n{shape.label}: {args.samples} samples x {args.tokens} tokens, aux layers {shape.aux} + last "
        f"{shape.last} = {nbytes / args.samples / 1e6:.1f} MB of hidden states per sample; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    w = max(map(len, m.rows)) + 2
    print(f"{'path':<{w}}{'first/s':>9}{'samples/s':>11}{'MB/s':>9}{'x floor':>9}")
    for name, row in m.rows.items():
        s, n = m.medians[name], args.samples
        floor = m.medians[row.floor] / s
        print(f"{name:<{w}}{n / m.first[name][0]:>9.1f}{n / s:>11.1f}{nbytes / s / 1e6:>9.0f}{floor:>9.3g}")
    print(f"each dataset epoch opens a CacheClient: {m.client_start_s * 1e3:.0f} ms of it (median)")


def run(args: argparse.Namespace) -> None:
    """Both shapes, one after the other, against one moto server."""
    shapes = [
        Shape("demo target (8 layers, hidden 128, float32)", 8, 128, "float32"),  # demo/__main__.py's tiny Qwen3
        Shape(f"{args.hidden}-wide bfloat16 (64 layers)", 64, args.hidden, "bfloat16"),
    ]
    load = os.getloadavg()
    print(
        f"median of {args.repeats} interleaved epochs after the first; first/s: the first epoch, its files "
        f"dropped from the page cache; {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} "
        f"{load[2]:.1f} at start"
    )
    with tempfile.TemporaryDirectory(prefix="training-feed-bench-") as tmp, ExitStack() as stack:
        env = stack.enter_context(moto_server(Path(tmp) / "moto.log"))
        stack.enter_context(aws_environment(env))  # the servers inherit it
        for i, shape in enumerate(shapes):
            report(args, shape, bench_shape(args, shape, Path(tmp) / f"shape-{i}"))


def main() -> None:
    """`python -m bench.training_feed`; `--serve` is the server subprocess."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=5120, help="width of the wide shape (bfloat16)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per sample")
    p.add_argument("--samples", type=int, default=8, help="samples per epoch")
    p.add_argument("--repeats", type=int, default=4, help="timed epochs per row")
    p.add_argument("--prefetch", type=int, default=4, help="the dataset's prefetch")
    p.add_argument("--read-threads", dest="read_threads", type=int, default=4, help="the servers' store read threads")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--num-layers", dest="num_layers", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dtype", choices=sorted(DTYPES), help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
