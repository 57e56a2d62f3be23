"""One drafter checkpoint's chain tau and DDTree tau over a prompt set, evaluated three ways side by side.

Run from the repository root: `.venv/bin/python -m bench.eval_throughput [--target-layers 12]
[--target-hidden 256] [--drafter-layers 1] [--block-size 8] [--prompts 16] [--response-len 128]`.
  batched        - what the eval worker does: cached taps, `draft_anchors` over every anchor, then the walks;
  round-by-round - the same cached taps, one `draft_block` forward per round, following each walk;
  no cache       - a full `target_forward` over every prompt for its taps, then the batched evaluation.
The cached taps are tensors already in memory (fetching them over HTTP is `bench/serve_hidden.py`'s
subject); response tokens are stored in every case, so no path pays for generation. The three paths
must give identical per-round taus, or the run stops. Each time is the median of `--repeats` runs, all
under the same `--threads` (default 1: on 2 shared cores extra intra-op threads only thrash). Analytic
FLOP ratios for a 64-layer H=5120 target follow, to extrapolate the no-cache penalty to a real target.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import SPARE_ROWS, build_tiny_model
from eval_worker.checkpoints.layer_ids import default_layer_ids
from eval_worker.drafters.batched import draft_anchors
from eval_worker.drafters.model import DFlashDrafter, draft_block
from eval_worker.scoring.acceptance import DraftLookup, chain_round_taus, tree_round_taus
from tests.support.live_loop import target_heads
from tests.support.taps import target_forward
from tests.support.tiny_trainer import Sequences, TinyTrainer, tiny_drafter_config

R = TypeVar("R")
Taus = list[tuple[list[int], list[int]]]  # per prompt: (chain round taus, tree round taus)


@dataclass(frozen=True)
class Workload:
    token_ids: list[Tensor]  # [T] prompt + greedy response, per prompt
    prompt_len: int
    layer_ids: list[int]
    embed: Tensor  # [V, H]
    lm_head: Tensor  # [V, H]
    block_size: int
    budget: int
    chunk_size: int


@dataclass(frozen=True)
class Outcome:
    taus: Taus
    forwards: int  # drafter forwards: anchors drafted (batched) or rounds drafted (round-by-round)


def walks(ids: Tensor, drafts: DraftLookup, w: Workload) -> tuple[list[int], list[int]]:
    """(chain round taus, tree round taus) of one prompt."""
    tokens = ids.tolist()
    return (
        chain_round_taus(tokens, w.prompt_len, w.block_size, drafts),
        tree_round_taus(tokens, w.prompt_len, w.block_size, drafts, w.budget),
    )


def evaluate_batched(drafter: DFlashDrafter, taps: Sequence[Tensor], w: Workload) -> Outcome:
    taus: Taus = []
    anchors = 0
    for ids, t in zip(w.token_ids, taps, strict=True):
        span = range(w.prompt_len, ids.shape[0] - 1)
        drafts = draft_anchors(drafter, t, ids, span, w.embed, w.lm_head, top_k=w.budget, chunk_size=w.chunk_size)
        taus.append(walks(ids, drafts, w))
        anchors += len(span)
    return Outcome(taus, anchors)


class RoundDrafts:
    """A `DraftLookup` that runs the literal one-round forward each time a walk asks for an anchor."""

    def __init__(self, drafter: DFlashDrafter, taps: Tensor, token_ids: Tensor, w: Workload) -> None:
        self.drafter, self.taps, self.token_ids, self.w = drafter, taps, token_ids, w
        self.forwards = 0

    @torch.no_grad()
    def _logits(self, s: int) -> Tensor:
        self.forwards += 1
        block = torch.tensor([int(self.token_ids[s])] + [self.drafter.cfg.mask_token_id] * (self.w.block_size - 1))
        return draft_block(self.drafter, self.taps[:s], block, self.w.embed, self.w.lm_head)  # [B-1, V]

    def greedy_drafts(self, s: int) -> list[int]:
        return [int(t) for t in self._logits(s).argmax(dim=-1).tolist()]

    def top(self, s: int) -> tuple[Tensor, Tensor]:
        top = torch.log_softmax(self._logits(s).float(), dim=-1).topk(min(self.w.budget, self.w.embed.shape[0]))
        return top.values, top.indices


def evaluate_round_by_round(drafter: DFlashDrafter, taps: Sequence[Tensor], w: Workload) -> Outcome:
    taus: Taus = []
    forwards = 0
    for ids, t in zip(w.token_ids, taps, strict=True):
        drafts = RoundDrafts(drafter, t, ids, w)
        taus.append(walks(ids, drafts, w))
        forwards += drafts.forwards
    return Outcome(taus, forwards)


def compute_taps(target: nn.Module, w: Workload, batch: int) -> list[Tensor]:
    """Taps [T, K*H] of every prompt, from batched target forwards (all sequences have the same length)."""
    taps: list[Tensor] = []
    for start in range(0, len(w.token_ids), batch):
        ids = torch.stack(w.token_ids[start : start + batch])  # [n, T]
        taps.extend(target_forward(target, ids, w.layer_ids).taps)
    return taps


def timed(fn: Callable[[], R], repeats: int) -> tuple[R, float]:
    """fn's result and its median wall time over `repeats` runs, after one warm-up run."""
    out = fn()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return out, statistics.median(seconds)


# --- FLOP model (multiply-adds x 2; norms, RoPE, softmax ignored) -------------------------------------


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def layer_per_token(self) -> int:
        """q/k/v/o projections and the SwiGLU MLP of one token through one layer."""
        h, qd, kvd = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * h * (2 * qd + 2 * kvd) + 6 * h * self.intermediate

    def attention(self, queries: int, keys: int) -> int:
        return 4 * self.heads * self.head_dim * queries * keys


def target_flops(t: Shape, total: int) -> int:
    """One causal forward over `total` tokens, lm_head included (target_forward computes logits)."""
    causal_pairs = total * (total + 1) // 2
    return total * (t.layers * t.layer_per_token() + 2 * t.hidden * t.vocab) + t.layers * t.attention(1, causal_pairs)


def drafter_flops(d: Shape, taps: int, block: int, total: int, prompt_len: int) -> int:
    """Batched drafting of every anchor s in [prompt_len, total - 1) of one sequence (as `draft_anchors`)."""
    kvd = d.kv_heads * d.head_dim
    context = total * (2 * taps * d.hidden * d.hidden + d.layers * 4 * d.hidden * kvd)  # fc, then k/v per layer
    anchors = range(prompt_len, total - 1)
    blocks = len(anchors) * (block * d.layers * d.layer_per_token() + 2 * (block - 1) * d.hidden * d.vocab)
    attention = d.layers * sum(d.attention(block, s + block) for s in anchors)
    return context + blocks + attention


def flop_ratios(
    t: Shape, drafter_layers: int, taps: int, block: int, total: int, prompt_len: int
) -> tuple[float, float]:
    """(one target forward over a sequence / drafting all its anchors batched,
    one target token / one drafted block, layers and heads only: no attention, no context projection)."""
    d = Shape(drafter_layers, t.hidden, t.heads, t.kv_heads, t.head_dim, t.intermediate, t.vocab)
    per_seq = target_flops(t, total) / drafter_flops(d, taps, block, total, prompt_len)
    token = t.layers * t.layer_per_token() + 2 * t.hidden * t.vocab
    drafted_block = block * d.layers * d.layer_per_token() + 2 * (block - 1) * d.hidden * d.vocab
    return per_seq, token / drafted_block


QWEN3_32B = Shape(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)


# --- setup (untimed) and report -----------------------------------------------------------------------


def build_workload(target: Any, args: argparse.Namespace) -> Workload:
    cfg = target.config
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(3, cfg.vocab_size - SPARE_ROWS, (args.prompts, args.prompt_len), generator=gen)
    with torch.no_grad():
        full = target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=args.response_len,
            min_new_tokens=args.response_len,
            do_sample=False,
            pad_token_id=cfg.pad_token_id,
        )
    embed, lm_head = target_heads(target)
    return Workload(
        token_ids=list(full),
        prompt_len=args.prompt_len,
        layer_ids=default_layer_ids(cfg.num_hidden_layers, args.taps),
        embed=embed,
        lm_head=lm_head,
        block_size=args.block_size,
        budget=args.tree_budget,
        chunk_size=args.chunk_size,
    )


def build_drafter(target: Any, w: Workload, taps: list[Tensor], args: argparse.Namespace) -> DFlashDrafter:
    """Random weights, then `--train-steps` of the tiny trainer on these very sequences (for a tau above 1)."""
    cfg = tiny_drafter_config(target.config, w.layer_ids, block_size=args.block_size, num_layers=args.drafter_layers)
    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(cfg, len(w.layer_ids))
    if args.train_steps:
        data = Sequences(w.token_ids, taps, [w.prompt_len] * len(taps))
        TinyTrainer(drafter, data, w.embed, w.lm_head, lr=3e-3, seed=args.seed).run(args.train_steps)
    return drafter.eval()


def mean_tau(taus: Taus, index: int) -> float:
    means = [sum(t[index]) / len(t[index]) for t in taus if t[index]]
    return sum(means) / len(means)


def print_flop_ratios(c: Any, args: argparse.Namespace, t_target: float, t_batched: float) -> None:
    """Analytic target-forward / drafter FLOPs for this run's shapes and for a real 64-layer target,
    and the no-cache penalty this run's measured efficiency predicts for the latter."""
    tiny = Shape(
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.intermediate_size,
        c.vocab_size,
    )
    total = args.prompt_len + args.response_len
    cases = [
        ("this run", tiny, args.drafter_layers, total, args.prompt_len),
        ("Qwen3-32B-like", QWEN3_32B, 1, total, args.prompt_len),
        ("Qwen3-32B-like", QWEN3_32B, 1, 2048, 512),
    ]
    print()
    print(f"FLOPs, target forward / drafter forward, block size {args.block_size}. Per sequence: one target")
    print("forward over it / drafting all its anchors batched. Per block: one target token / one drafted block.")
    ratios = []
    for label, shape, layers, t, prompt_len in cases:
        seq, block = flop_ratios(shape, layers, args.taps, args.block_size, t, prompt_len)
        ratios.append(seq)
        print(
            f"  {label:<15} target {shape.layers:2d} layers H={shape.hidden:<4} V={shape.vocab:<6}, drafter "
            f"{layers} layer(s), T={t:<4} (prompt {prompt_len:3d}): per sequence {seq:5.2f}, per block {block:5.2f}"
        )
    efficiency = (t_target / t_batched) / ratios[0]  # measured time ratio per FLOP ratio on this machine
    print(
        f"Measured here: target forward / batched evaluation = {t_target / t_batched:.2f} in time vs "
        f"{ratios[0]:.2f} in FLOPs.\n"
        f"Extrapolation: no cache / batched ~ 1 + per-sequence FLOP ratio x {efficiency:.2f}, i.e. "
        f"~{1 + ratios[1] * efficiency:.1f}x (T={total}) and ~{1 + ratios[2] * efficiency:.1f}x (T=2048) for a\n"
        "64-layer H=5120 target with a 1-layer drafter, against this run's tiny target. There the no-cache\n"
        "path also needs the whole target resident on accelerators; the cached path only embed_tokens + lm_head."
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-layers", type=int, default=12)
    p.add_argument("--target-hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--drafter-layers", type=int, default=1)
    p.add_argument("--taps", type=int, default=5, help="target layers the drafter reads (DFlash formula)")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--tree-budget", type=int, default=8, help="DDTree-B budget")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=16, help="anchors per batched drafter pass")
    p.add_argument("--target-batch", type=int, default=16, help="sequences per target forward (no cache)")
    p.add_argument("--train-steps", type=int, default=60, help="0 = random drafter (tau ~ 1)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, the same for all three paths")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(
            Path(tmp), layers=args.target_layers, hidden=args.target_hidden, vocab=args.vocab, seed=args.seed
        )
        target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    w = build_workload(target, args)
    cached = compute_taps(target, w, args.target_batch)  # what the cache holds, computed once
    drafter = build_drafter(target, w, cached, args)

    def no_cache() -> Outcome:
        return evaluate_batched(drafter, compute_taps(target, w, args.target_batch), w)

    batched, t_batched = timed(lambda: evaluate_batched(drafter, cached, w), args.repeats)
    rounds, t_rounds = timed(lambda: evaluate_round_by_round(drafter, cached, w), args.repeats)
    uncached, t_uncached = timed(no_cache, args.repeats)
    _, t_target = timed(lambda: compute_taps(target, w, args.target_batch), args.repeats)
    if not batched.taus == rounds.taus == uncached.taus:
        raise SystemExit("per-round taus differ between the three paths; the timings below would mean nothing")

    chain_rounds = sum(len(c) for c, _ in batched.taus)
    tree_rounds = sum(len(t) for _, t in batched.taus)
    n = len(w.token_ids)
    c = target.config
    print(
        f"target {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}; drafter "
        f"{args.drafter_layers} layer(s), block {args.block_size}, taps {w.layer_ids}; {n} prompts x "
        f"({args.prompt_len} prompt + {args.response_len} greedy response) tokens; {args.threads} torch "
        f"thread(s); median of {args.repeats}"
    )
    print(
        f"chain tau {mean_tau(batched.taus, 0):.3f} ({chain_rounds} rounds), DDTree-{args.tree_budget} tau "
        f"{mean_tau(batched.taus, 1):.3f} ({tree_rounds} rounds); drafter trained {args.train_steps} steps "
        "on these sequences"
    )
    print("per-round taus: identical across batched, round-by-round and no-cache")
    print()
    rows = [
        ("batched (cached taps)", t_batched, f"{batched.forwards / t_batched:8.0f} anchors/s"),
        ("round-by-round (cached taps)", t_rounds, f"{rounds.forwards / t_rounds:8.0f} rounds/s"),
        (
            f"no cache (target {t_target:.2f} s + batched)",
            t_uncached,
            f"{uncached.forwards / t_uncached:8.0f} anchors/s",
        ),
    ]
    print(f"{'path':<38} {'wall s':>8} {'prompts/s':>10}  drafter forwards")
    for name, seconds, rate in rows:
        print(f"{name:<38} {seconds:8.3f} {n / seconds:10.2f}  {rate}")
    print()
    print(
        f"round-by-round / batched: {t_rounds / t_batched:6.2f}x  ({rounds.forwards} one-round forwards, "
        f"{batched.forwards} anchors in chunks of {args.chunk_size})"
    )
    print(f"no cache / batched:       {t_uncached / t_batched:6.2f}x")
    print_flop_ratios(target.config, args, t_target, t_batched)


if __name__ == "__main__":
    main()
