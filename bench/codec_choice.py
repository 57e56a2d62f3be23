"""Compare lossless codecs on one LLM-like bf16 layer: ratio, encode GB/s, decode GB/s.

Run from the repository root: `.venv/bin/python -m bench.codec_choice [--tokens 2048] [--hidden 2048]`.
The numbers feed the codec choice in `cache_server/store/chunks.py`. Codecs run single-threaded, as zarr runs
them (zarr sets `numcodecs.blosc.use_threads = False` and parallelises over chunks instead). The last line is
the same layer in an FP8 store (`--store-dtype float8_e4m3fn`): FP8 bytes and a float32 scale per token under
the chosen codec, its ratio the plan's documented FP8 figure (`schemas/plan.py`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numcodecs
import numcodecs.blosc
import numpy as np
import torch

from bench.activations import activation_like
from cache_server.store.fp8 import quantize
from cache_server.torch_utils import as_numpy


@dataclass(frozen=True)
class Result:
    name: str
    ratio: float
    encode_gbps: float
    decode_gbps: float


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(name: str, codec: numcodecs.abc.Codec | None, raw: np.ndarray, repeats: int) -> Result:
    nbytes = raw.nbytes
    if codec is None:
        # "No compression" still pays one copy each way (file read into the output buffer).
        enc_s = best_seconds(lambda: raw.tobytes(), repeats)
        dec_s = best_seconds(lambda: np.frombuffer(raw.tobytes(), dtype=raw.dtype).copy(), repeats)
        return Result(name, 1.0, nbytes / enc_s / 1e9, nbytes / dec_s / 1e9)
    encoded = codec.encode(raw)
    decoded = np.frombuffer(codec.decode(encoded), dtype=raw.dtype).reshape(raw.shape)
    if not np.array_equal(decoded, raw):
        raise SystemExit(f"{name} is not lossless")
    enc_s = best_seconds(lambda: codec.encode(raw), repeats)
    dec_s = best_seconds(lambda: codec.decode(encoded), repeats)
    return Result(name, nbytes / len(encoded), nbytes / enc_s / 1e9, nbytes / dec_s / 1e9)


def candidates() -> list[tuple[str, numcodecs.abc.Codec | None]]:
    shuffle = numcodecs.Blosc.SHUFFLE
    return [
        (
            "blosc zstd clevel1 shuffle bs=1MiB",
            numcodecs.Blosc(cname="zstd", clevel=1, shuffle=shuffle, blocksize=1 << 20),
        ),
        ("blosc zstd clevel1 shuffle bs=auto", numcodecs.Blosc(cname="zstd", clevel=1, shuffle=shuffle)),
        ("blosc defaults (lz4 clevel5 shuffle)", numcodecs.Blosc()),
        ("zarr BloscCodec defaults (zstd 5 shuf)", numcodecs.Blosc(cname="zstd", clevel=5, shuffle=shuffle)),
        (
            "blosc lz4 clevel5 shuffle bs=1MiB",
            numcodecs.Blosc(cname="lz4", shuffle=shuffle, blocksize=1 << 20),
        ),
        ("zstd level1 (no shuffle)", numcodecs.Zstd(level=1)),
        ("none", None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    numcodecs.blosc.use_threads = False
    raw = as_numpy(activation_like(args.tokens, args.hidden, torch.bfloat16, seed=0)).view(np.uint16)  # bf16 bits
    print(f"layer [{args.tokens}, {args.hidden}] bf16 = {raw.nbytes / 2**20:.1f} MiB, best of {args.repeats}")
    print(f"{'codec':<40} {'ratio':>6} {'enc GB/s':>9} {'dec GB/s':>9}")
    for name, codec in candidates():
        r = measure(name, codec, raw, args.repeats)
        print(f"{r.name:<40} {r.ratio:>6.3f} {r.encode_gbps:>9.2f} {r.decode_gbps:>9.2f}")
    fp8, scales = quantize(0, activation_like(args.tokens, args.hidden, torch.bfloat16, seed=0))
    r = measure("fp8 e4m3 (+ scales), chosen codec", candidates()[0][1], fp8, args.repeats)
    stored = fp8.nbytes / r.ratio + scales.nbytes  # scales are stored uncompressed
    print(
        f"{r.name:<40} {(fp8.nbytes + scales.nbytes) / stored:>6.3f} {r.encode_gbps:>9.2f} {r.decode_gbps:>9.2f}"
        f"   {stored / args.tokens:.0f} B per token stored, {raw.nbytes / stored:.2f}x fewer than bf16 raw"
    )


if __name__ == "__main__":
    main()
