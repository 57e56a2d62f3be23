"""Where a first run's time goes: generating the responses. The same prompts, side by side in one run,
from registration to all ready, with responses generated (a) in-process 4 sequences per `generate`
call (what `--batch-tokens 8192` allowed with `max_new_tokens` 2048 when generation ran inside the
capture batch), (b) in-process `--generate-batch 64`, (c) by vLLM (`--generator`), then a model of
the same choice at real scale.

Run from the repository root: `.venv/bin/python -m bench.generation [--prompts 64] [--max-new-tokens 128]`.
The target is a random Qwen3 on CPU (head_dim 32, which vLLM's CPU attention takes); the engine runs
from `.venv-vllm` (`./dev test` builds it) and shares this machine's cores with the cache server, and
its ~45 s start is not counted. On a GPU node the ratio is set by memory bandwidth (the model below).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from testing.engine import VllmServer
from testing.servers import free_port, running_server

WORDS = "the quick brown fox jumps over a lazy dog while the target verifies drafted tokens in one pass".split()  # noqa: SIM905


def prompts(n: int) -> list[dict[str, str]]:
    """`n` distinct prompts of 4 to 40 words."""
    return [
        {"text": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + (i * 7) % 37)) + f" {i}"} for i in range(n)
    ]


def time_to_ready(url: str, specs: list[dict[str, str]], max_new_tokens: int) -> float:
    with CacheClient(url) as client:
        t0 = time.perf_counter()
        ids = [p.prompt_id for p in client.register(specs, max_new_tokens=max_new_tokens)]
        client.wait_ready(ids, timeout_s=3600, poll_s=0.05)
        return time.perf_counter() - t0


def measured(args: argparse.Namespace) -> None:
    specs = prompts(args.prompts)
    new_tokens = args.prompts * args.max_new_tokens
    with tempfile.TemporaryDirectory(prefix="generation-bench-") as tmp:
        model = build_tiny_model(Path(tmp) / "target", layers=args.layers, hidden=args.hidden, head_dim=32)
        engine = VllmServer(model, free_port(), Path(tmp) / "vllm.log")
        engine.start()
        try:
            modes = [
                ("(a) in-process, 4 per generate call", ("--generate-batch", "4")),
                ("(b) in-process, --generate-batch 64", ("--generate-batch", "64")),
                ("(c) vLLM, --generator", ("--generator", engine.url, "--generator-concurrency", "64")),
            ]
            rows = []
            for name, extra in modes:
                store = Path(tmp) / f"store-{len(rows)}"
                with running_server(model, store, "--batch-tokens", str(args.batch_tokens), *extra) as url:
                    wall = time_to_ready(url, specs, args.max_new_tokens)
                rows.append((name, wall))
        finally:
            engine.stop()
    print(
        f"\n{args.prompts} prompts x {args.max_new_tokens} new tokens, target {args.layers} layers x {args.hidden} "
        f"(fp32, CPU, {os.cpu_count()} cores), registration to all ready (generation + capture):"
    )
    print("| responses from | registration to ready | new tokens/s | vs (a) |")
    print("| --- | --- | --- | --- |")
    for name, wall in rows:
        print(f"| {name} | {wall:.1f} s | {new_tokens / wall:.0f} | {rows[0][1] / wall:.2f}x |")


def real_scale(args: argparse.Namespace) -> None:
    """Decode is memory-bound: each step reads every weight once and each sequence's KV cache, and the
    batch is bounded by the KV cache that fits beside the weights."""
    weights = 54e9  # a 27B-class target in bf16 (64 layers, H = 5120)
    kv_per_token = 64 * 2 * 8 * 128 * 2  # layers x (k, v) x 8 KV heads x head_dim 128 x bf16 bytes
    bandwidth, memory = 4.8e12, 141e9  # H200: HBM3e bytes/s and bytes
    total = 1000 * 2048  # 1,000 prompts x 2,048 new tokens
    context = 512 + 2048 / 2  # mean tokens in a sequence's cache over its decode
    fits = int((0.9 * memory - weights) / (context * kv_per_token))  # vLLM's default 0.9 of the GPU
    print(
        f"\nModel at real scale: 64 layers, H=5120, bf16 ({weights / 1e9:.0f} GB of weights, "
        f"{kv_per_token / 1e3:.0f} KB of KV per token), one H200 (4.8 TB/s, 141 GB), 1,000 prompts of 512 "
        f"tokens x 2,048 new tokens; {fits} sequences fit in 0.9 of the GPU:"
    )
    print("| sequences per decode step | bytes read per step | step | tokens/s | 1,000 x 2,048 tokens |")
    print("| --- | --- | --- | --- | --- |")
    for batch in (4, 64, fits):
        step_bytes = weights + batch * context * kv_per_token
        rate = batch * bandwidth / step_bytes
        hours = total / rate / 3600
        took = f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.0f} min"
        print(f"| {batch} | {step_bytes / 1e9:.0f} GB | {step_bytes / bandwidth * 1e3:.1f} ms | {rate:,.0f} | {took} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--model-only", action="store_true", help="print the real-scale model alone")
    args = p.parse_args()
    if not args.model_only:
        measured(args)
    real_scale(args)


if __name__ == "__main__":
    main()
