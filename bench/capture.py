"""Capture by the serving engine (`--capture engine`: vLLM prefills, its connector writes each
sequence's layers to a file the server reads, checks and deletes) against capture by the server's own
transformers forward (`--capture hf`), side by side in one run: capture throughput, the server's
resident memory in each mode, then a model of the engine's memory and file bandwidth at real scale.

Run from the repository root: `.venv/bin/python -m bench.capture [--sequences 32] [--seq-tokens 256]
[--repeats 5] [--model-only]`.
Throughput: the same sequences, in the batches the scheduler makes under `--batch-tokens`, through
`open_hf_target(...).capturer` in this process and through `open_engine_target(...).capturer` on a
vLLM launched from `.venv-vllm` (`./dev test` builds it) with every layer as an aux id; all layers,
fp32, CPU; the median of `--repeats` interleaved rounds after one warm-up each. On CPU both forwards
are the same fp32 math on this machine's cores (only the two CPU implementations differ). A GPU
changes that: the engine's kernels (FlashAttention, CUDA graphs, FP8) and its continuous batching make
its forward much faster than transformers', while the round trip (write, read and delete of
n_aux x H x dtype bytes per token) stays a disk cost: the model below. Memory: `cache-server serve`
over a larger random target, VmRSS and VmHWM from /proc after 8 prompts are captured, in each mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cache_server.capture.captured import Captured, Capturer
from cache_server.capture.target import open_hf_target
from cache_server.capture.tiny_model import SPARE_ROWS, build_tiny_model
from cache_server.capture.tokenizer import stop_token_ids
from cache_server.client import CacheClient
from cache_server.generation.engine import connect
from cache_server.generation.engine_target import open_engine_target
from testing.engine import CONNECTOR_DIR, VllmServer, capture_flags, vllm_python
from testing.servers import free_port, running_server

VOCAB = 512
NO_ENGINE = "the vLLM environment .venv-vllm is missing (./dev test builds it): the measured rows are skipped"


def scheduler_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of sequences in the batches `--batch-tokens budget` makes: in order, each batch as many
    as fit in `budget` tokens (at least one), as `Responses.take` packs them."""
    out: list[list[int]] = []
    tokens = budget + 1
    for i, n in enumerate(lengths):
        if out and tokens + n <= budget:
            out[-1].append(i)
            tokens += n
        else:
            out.append([i])
            tokens = n
    return out


def random_sequences(n: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """`n` sequences of `tokens` random ids that the tokenizer emits (no spare rows)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, VOCAB - SPARE_ROWS, tokens)] for _ in range(n)]


def capture_all(capturer: Capturer, seqs: list[list[int]], layers: list[int], budget: int) -> list[Captured]:
    """Every sequence through `capturer`, batch by batch; half of each is the prompt."""
    out: list[Captured] = []
    for batch in scheduler_batches([len(s) for s in seqs], budget):
        part = [seqs[i] for i in batch]
        for result in capturer.capture(part, [len(s) // 2 for s in part], layers):
            if isinstance(result, Exception):
                raise result
            out.append(result)
    return out


def throughput(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, float], float]:
    """Median seconds per pass over the sequences by each capturer, and the largest |engine - HF|."""
    model = build_tiny_model(tmp / "target", layers=args.layers, hidden=args.hidden, vocab=VOCAB, head_dim=32)
    layers = list(range(args.layers))
    files = tmp / "engine-files"
    files.mkdir()
    flags = capture_flags(range(1, args.layers + 1), files, connector_dir=CONNECTOR_DIR)
    engine_server = VllmServer(model, free_port(), tmp / "vllm-throughput.log", *flags, pythonpath=[CONNECTOR_DIR])
    engine_server.start()
    try:
        engine = connect(
            engine_server.url, model=None, target_name=model.name, stop_token_ids=stop_token_ids(model), timeout_s=300
        )
        capturers: dict[str, Capturer] = {
            "hf": open_hf_target(model, device="cpu", dtype="float32").capturer,
            "engine": open_engine_target(
                model,
                engine,
                files=files,
                capture_layers=layers,
                storage="exact",
                timeout_s=300,
                concurrency=64,
                orphan_after_s=600,
            ).capturer,
        }
        seqs = random_sequences(args.sequences, args.seq_tokens)
        first = {name: capture_all(c, seqs, layers, args.batch_tokens) for name, c in capturers.items()}  # warm-up
        diff = max(
            float((e.states[k] - h.states[k]).abs().max())
            for e, h in zip(first["engine"], first["hf"], strict=True)
            for k in layers
        )
        del first
        times: dict[str, list[float]] = {name: [] for name in capturers}
        for _ in range(args.repeats):
            for name, capturer in capturers.items():
                t0 = time.perf_counter()
                capture_all(capturer, seqs, layers, args.batch_tokens)
                times[name].append(time.perf_counter() - t0)
        for capturer in capturers.values():
            capturer.close()
    finally:
        engine_server.stop()
    return {name: statistics.median(t) for name, t in times.items()}, diff


def serve_pid(port: int) -> int:
    """The pid of this process's `cache-server serve` child on `port` (from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"cache_server.cli" in argv and str(port).encode() in argv:
            return int(entry.name)
    raise LookupError(f"no cache-server serve child on port {port}")


def memory_mib(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM (peak) of `pid`, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def served_memory(model: Path, store: Path, extra: Sequence[str], seqs: list[list[int]]) -> tuple[float, float]:
    """A server's VmRSS and VmHWM (MiB) once it has captured `seqs` (8 new tokens each)."""
    port = free_port()
    with running_server(model, store, *extra, port=port) as url, CacheClient(url) as client:
        ids = [p.prompt_id for p in client.register([{"token_ids": s} for s in seqs], max_new_tokens=8)]
        client.wait_ready(ids, timeout_s=600, poll_s=0.1)
        return memory_mib(serve_pid(port))


def server_memory(args: argparse.Namespace, tmp: Path) -> tuple[float, dict[str, tuple[float, float]]]:
    """The larger target's weights (MiB) and each mode's server memory (VmRSS, VmHWM in MiB)."""
    model = build_tiny_model(
        tmp / "large", layers=args.rss_layers, hidden=args.rss_hidden, vocab=VOCAB, head_dim=args.rss_head_dim
    )
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors")) / 2**20
    seqs = random_sequences(8, args.seq_tokens, seed=1)
    rows = {"--capture hf": served_memory(model, tmp / "store-hf", ["--capture", "hf"], seqs)}
    files = tmp / "large-files"
    files.mkdir()
    flags = capture_flags(range(1, args.rss_layers + 1), files, connector_dir=CONNECTOR_DIR)
    engine_server = VllmServer(model, free_port(), tmp / "vllm-memory.log", *flags, pythonpath=[CONNECTOR_DIR])
    engine_server.start()
    try:
        extra = ["--capture", "engine", "--generator", engine_server.url, "--engine-files", str(files)]
        rows["--capture engine"] = served_memory(model, tmp / "store-engine", extra, seqs)
    finally:
        engine_server.stop()
    return weights, rows


def measured(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="capture-bench-") as tmp:
        seconds, diff = throughput(args, Path(tmp))
        weights, memory = server_memory(args, Path(tmp))
    tokens = args.sequences * args.seq_tokens
    print(
        f"\nCapture of {args.sequences} sequences x {args.seq_tokens} tokens, all {args.layers} layers of a random "
        f"Qwen3 (H={args.hidden}, fp32) on CPU ({os.cpu_count()} cores, load average {load:.1f} at start), "
        f"--batch-tokens {args.batch_tokens}; median of {args.repeats} interleaved passes; "
        f"max |engine - HF| over all states {diff:.1e}:"
    )
    print("| capture | s per pass | tokens/s | vs hf |")
    print("| --- | --- | --- | --- |")
    for name, label in (("hf", "hf: in-process transformers forward"), ("engine", "engine: vLLM prefill + file")):
        s = seconds[name]
        print(f"| {label} | {s:.2f} | {tokens / s:,.0f} | {seconds['hf'] / s:.2f}x |")
    print(
        f"(engine file per token: {args.layers} aux x {args.hidden} x 4 B = {args.layers * args.hidden * 4 / 1024:.0f} "
        "KiB written, read and deleted; on CPU both forwards are the same fp32 math on the same cores, and "
        "the engine's GPU kernels and batching, which make its forward faster there, do not show)"
    )
    print(
        f"\n`cache-server serve --device cpu` over a {args.rss_layers}-layer H={args.rss_hidden} random target "
        f"({weights:.0f} MiB of fp32 weights), after capturing 8 prompts of {args.seq_tokens} tokens + 8 new:"
    )
    print("| mode | VmRSS | VmHWM (peak) | VmRSS below --capture hf |")
    print("| --- | --- | --- | --- |")
    for mode, (rss, hwm) in memory.items():
        print(f"| {mode} | {rss:.0f} MiB | {hwm:.0f} MiB | {memory['--capture hf'][0] - rss:.0f} MiB |")
    print("(--capture engine loads the tokenizer and the heads only: the weights live in the engine's process)")


def real_scale(args: argparse.Namespace) -> None:
    """The engine keeps each token's aux states in its cache until the request ends and writes them to a
    file; a 64-layer target's states outweigh its KV cache, and at FP8 prefill rates all layers outrun NVMe."""
    layers, hidden, taps, dtype_bytes = 64, 5120, 5, 2  # a 27B-class target, bf16
    kv = layers * 2 * 8 * 128 * dtype_bytes  # layers x (k, v) x 8 KV heads x head_dim 128
    flops = 2 * 27e9  # per prefilled token (attention at 2k context adds ~2%)
    rates = {"bf16 at 40% of 989": 0.40 * 989e12 / flops, "FP8 at 55% of 1,979": 0.55 * 1979e12 / flops}
    budget, nvme = args.budget_gib * 2**30, args.nvme_gbps * 1e9
    per_token = {f"all {layers}": layers * hidden * dtype_bytes, f"{taps} taps": taps * hidden * dtype_bytes}
    print(
        f"\nModel at real scale: {layers} layers, H={hidden}, bf16, one H200. The engine's hidden-state cache "
        f"holds n_aux x H x 2 B per token in flight (its KV cache another {kv / 1024:.0f} KiB); "
        f"{args.budget_gib:g} GiB for states:"
    )
    print(f"| aux layers | states per token | tokens in {args.budget_gib:g} GiB | 2,048-token sequences |")
    print("| --- | --- | --- | --- |")
    for name, b in per_token.items():
        n = b // (hidden * dtype_bytes)
        fits = int(budget // b)
        print(f"| {name} | {n} x {hidden} x 2 B = {b / 1024:.0f} KiB | {fits:,} | {fits // 2048:,} |")
    print(
        "\nFile bytes written per second = prefill tokens/s x states per token, against NVMe at "
        f"{args.nvme_gbps:g} GB/s; prefill tokens/s = peak TFLOP/s x MFU / (2 x 27e9 FLOP per token) (assumed):"
    )
    print("| prefill rate | " + " | ".join(f"{name}: writes | x NVMe" for name in per_token) + " |")
    print("| --- " * (1 + 2 * len(per_token)) + "|")
    for how, rate in rates.items():
        cells = [f"{b * rate / 1e9:.1f} GB/s | {b * rate / nvme:.2f}" for b in per_token.values()]
        print(f"| {rate:,.0f} tok/s ({how} TFLOP/s) | " + " | ".join(cells) + " |")
    print(
        f"(x NVMe > 1: disk-bound; all {layers} layers keep up only to {nvme / per_token[f'all {layers}']:,.0f} "
        "tok/s, and the server's read of each file comes on top unless the page cache still holds it)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--seq-tokens", dest="seq_tokens", type=int, default=256, help="at most 511 (the engine's 512)")
    p.add_argument("--batch-tokens", dest="batch_tokens", type=int, default=8192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rss-layers", dest="rss_layers", type=int, default=16)
    p.add_argument("--rss-hidden", dest="rss_hidden", type=int, default=1024)
    p.add_argument("--rss-head-dim", dest="rss_head_dim", type=int, default=64)
    p.add_argument("--budget-gib", dest="budget_gib", type=float, default=40.0, help="engine memory for states")
    p.add_argument("--nvme-gbps", dest="nvme_gbps", type=float, default=7.0)
    p.add_argument("--model-only", dest="model_only", action="store_true", help="print the real-scale model alone")
    args = p.parse_args()
    skipped = not args.model_only and vllm_python() is None
    if skipped:
        print(NO_ENGINE, file=sys.stderr)
    elif not args.model_only:
        measured(args)
    real_scale(args)
    if skipped:
        sys.exit(1)


if __name__ == "__main__":
    main()
