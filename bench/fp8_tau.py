"""What an FP8 store costs in tau and saves in bytes: the demo's drafters on exact vs FP8 features.

Run from the repository root after `./dev demo`: `.venv/bin/python -m bench.fp8_tau [--demo demo-out]`.
Two real servers over the demo's target, one exact and one `--store-dtype float8_e4m3fn`, each register
the demo's prompts (the target's own greedy responses: the same tokens in both stores). Every demo
checkpoint is evaluated against each (chain tau and its trees, as the demo's jobs do), then per
prompt; then the bytes each store holds per token per layer, and `/hidden` throughput of all layers of
every prompt, both encodings, best of `--repeats` (tiny prompts: request overhead dominates). Last, the
same at real size in-process (`--hidden 5120 --tokens 2048`, 5 bf16 layers, one local store each): the
store's read into a safetensors body (FP8: dequantized) and a pieces body built and decoded by the client.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.activations import activation_like
from bench.codec_choice import best_seconds
from cache_server.api.pieces_body import pieces_body
from cache_server.client import CacheClient
from cache_server.client.pieces import decode_pieces
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.locations import open_blobs
from cache_server.store.manifest import PromptManifest
from cache_server.store.usage import stored_bytes
from demo.__main__ import TEXTS
from eval_worker.cli import main as eval_worker
from schemas.report import EvalReport
from testing.servers import running_server

STORAGES = ("exact", "float8_e4m3fn")


def evaluate(url: str, checkpoint: Path, out: Path) -> EvalReport:
    trees = ["--eagle-tree", "4,3,16"] if checkpoint.name.startswith("eagle3") else ["--tree-budget", "8"]
    argv = ["evaluate", str(checkpoint), "--server", url, "--all-prompts", "--device", "cpu", *trees]
    if eval_worker([*argv, "--out", str(out)]) != 0:
        raise SystemExit(f"evaluating {checkpoint} against {url} failed")
    return EvalReport.model_validate_json(out.read_text())


def throughput(client: CacheClient, ids: list[str], layers: list[int], encoding: str, repeats: int) -> float:
    """MB/s of hidden states delivered (decoded, in the target dtype) for all layers of every prompt."""
    best = float("inf")
    nbytes = 0
    for _ in range(repeats):
        start = time.perf_counter()
        nbytes = sum(client.hidden(pid, layers, encoding=encoding).hidden.nbytes for pid in ids)  # type: ignore[arg-type]
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e6


def real_size(hidden: int, tokens: int, repeats: int) -> None:
    """GB/s of bf16 hidden states delivered from a local store, per storage: the server's read into the
    safetensors body, and a pieces body built on the server and decoded by the client."""
    layers = [1, 16, 31, 46, 61]
    data = {k: activation_like(tokens, hidden, torch.bfloat16, seed=k) for k in layers}
    for storage in STORAGES:
        with (
            tempfile.TemporaryDirectory() as root,
            HiddenStore(
                root, fingerprint="bench", model_name="bench", hidden_size=hidden, dtype=torch.bfloat16, storage=storage
            ) as store,
        ):  # type: ignore[arg-type]
            m = store.write("p", np.arange(tokens), 1, data)
            out = np.empty((tokens, len(layers) * hidden), store.numpy_dtype)
            read = best_of(partial(store.read_into, "p", layers, out), repeats)
            pieces = best_of(partial(decoded_pieces, store, m, layers, tokens), repeats)
            wire = pieces_body(store, m, layers, 0, tokens).nbytes
            on_disk = sum(n for (_, k), n in stored_bytes(store.blobs).items() if k != "none")
        print(
            f"{storage:<14} [{tokens}, {hidden}] bf16 x {len(layers)} layers: {on_disk / tokens / len(layers):.0f} B "
            f"per token per layer stored (raw {hidden * 2}); safetensors read {out.nbytes / read / 1e9:.2f} GB/s, "
            f"pieces {out.nbytes / pieces / 1e9:.2f} GB/s ({wire / out.nbytes:.2f} bytes on the wire per byte)"
        )


def decoded_pieces(store: HiddenStore, m: PromptManifest, layers: list[int], tokens: int) -> None:
    decode_pieces(pieces_body(store, m, layers, 0, tokens).joined())


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    return best_seconds(fn, repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--demo", type=Path, default=Path("demo-out"), help="a `python -m demo` output directory")
    p.add_argument("--new-tokens", type=int, default=48, help="response tokens per prompt (the demo's default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=5120, help="the real-size rows' hidden size")
    p.add_argument("--tokens", type=int, default=2048, help="the real-size rows' tokens")
    args = p.parse_args()
    target, checkpoints = args.demo / "target", sorted((args.demo / "runs").iterdir())
    reports: dict[tuple[str, str], EvalReport] = {}
    work = Path(tempfile.mkdtemp(prefix="fp8-tau-"))
    os.environ["EVAL_WORKER_HEADS_CACHE"] = str(work / "heads")
    for storage in STORAGES:
        store = work / storage / "store"
        store.parent.mkdir(parents=True)
        with running_server(target, store, "--store-dtype", storage) as url, CacheClient(url) as client:
            ids = [r.prompt_id for r in client.register([{"text": t} for t in TEXTS], max_new_tokens=args.new_tokens)]
            client.wait_ready(ids, timeout_s=600)
            info = client.model()
            for ckpt in checkpoints:
                reports[ckpt.name, storage] = evaluate(url, ckpt, work / f"{ckpt.name}-{storage}.json")
            layers = list(range(info.num_layers))
            tokens = sum(len(client.prompt(pid).token_ids or []) for pid in ids)
            per_layer = sum(n for (_, k), n in stored_bytes(open_blobs(str(store))).items() if k != "none")
            rates = {e: throughput(client, ids, layers, e, args.repeats) for e in ("safetensors", "pieces")}
            print(
                f"{storage:<14} {info.dtype} target, {tokens} tokens: {per_layer / tokens / len(layers):.1f} B per "
                f"token per layer stored (raw {info.hidden_size * (4 if info.dtype == 'float32' else 2)}); "
                f"/hidden all {len(layers)} layers: safetensors {rates['safetensors']:.0f} MB/s, "
                f"pieces {rates['pieces']:.0f} MB/s"
            )
    print(f"\n{'checkpoint':<18} {'draft':<12} {'tau exact':>10} {'tau fp8':>10} {'diff':>8}")
    for ckpt in checkpoints:
        exact, fp8 = reports[ckpt.name, "exact"], reports[ckpt.name, "float8_e4m3fn"]
        kinds = [("chain", exact.summary.chain, fp8.summary.chain)]
        kinds += [(f"ddtree-{b}", s, fp8.summary.trees[b]) for b, s in exact.summary.trees.items()]
        kinds += [(f"eagle-{k}", s, fp8.summary.eagle_trees[k]) for k, s in exact.summary.eagle_trees.items()]
        for kind, a, b in kinds:
            x, y = a.mean_tau or 0.0, b.mean_tau or 0.0
            print(f"{ckpt.name:<18} {kind:<12} {x:>10.4f} {y:>10.4f} {y - x:>+8.4f}")
    print("\nper prompt, chain tau exact / fp8 (prompt order as registered)")
    for ckpt in checkpoints:
        exact, fp8 = reports[ckpt.name, "exact"], reports[ckpt.name, "float8_e4m3fn"]
        pairs = [(a.chain.mean or 0.0, b.chain.mean or 0.0) for a, b in zip(exact.prompts, fp8.prompts, strict=True)]
        cells = " ".join(f"{a:.2f}/{b:.2f}" for a, b in pairs)
        diff = statistics.mean(b - a for a, b in pairs)
        same = sum(a.chain.round_taus == b.chain.round_taus for a, b in zip(exact.prompts, fp8.prompts, strict=True))
        print(f"{ckpt.name:<18} {cells}  mean diff {diff:+.4f}; {same}/{len(pairs)} prompts with identical rounds")
    print()
    real_size(args.hidden, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
