"""What one more checkpoint costs, measured side by side in one run against a real cache server.

Run from the repository root: `.venv/bin/python -m bench.eval_throughput [--prompts 16] [--response-len 128]`.
A tiny target whose lm_head dominates the drafter (hidden 128, vocab 8192), a cache server process
on loopback holding the prompts and the target's greedy responses, and a 1-layer drafter trained on
the cached features until its chain tau is above 2. Per checkpoint, on the same prompts:
  all-anchor  - draft every anchor, then walk (the old evaluator), features already in memory;
  walk cold   - walk-driven drafting, features fetched over HTTP (ahead of the drafter) from the server;
  walk warm   - walk-driven drafting, features resident in the worker's feature cache;
  target      - rerun the target over the prompts for its taps (no cache), then walk-driven drafting.
All four must give identical per-round taus, or the run stops. Then a sweep of 4 checkpoints in one
pass against 4 separate evaluations (HTTP requests and wall time); the CPU threads of the drafter
math: one long prompt (`--long-response-len`, 2k tokens), chain only, on torch's default threads
against eval-worker's default (one), alone and beside a CPU hog; and the FLOP accounting at published
shapes (`bench/flop_model.py`). (`--threads` sets the threads of everything but the threads section.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoModelForCausalLM

from bench.flop_model import published_table
from cache_server.capture.tiny_model import SPARE_ROWS, build_tiny_model
from cache_server.client import CacheClient
from eval_worker.checkpoints.layer_ids import default_layer_ids
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.evaluation.evaluate import evaluate
from eval_worker.evaluation.feature_cache import FeatureCache
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.sweep import evaluate_checkpoints
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN, walk_prompts
from eval_worker.settings import EvaluateSettings
from eval_worker.threads import cpu_threads
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.report import EvalReport
from testing.all_anchor import all_anchor_taus
from testing.checkpoints import save_torch_checkpoint
from testing.servers import HIDDEN_REQUESTS, running_server, server_metric
from testing.taps import target_forward
from testing.tiny_trainer import Sequences, TinyTrainer, tiny_drafter_config

R = TypeVar("R")
Taus = list[dict[int, list[int]]]


def timed(fn: Callable[[], R], repeats: int) -> tuple[R, float]:
    """fn's result and its median wall time over `repeats` runs, after one warm-up run."""
    out = fn()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - t0)
    return out, statistics.median(seconds)


def report_taus(report: EvalReport) -> Taus:
    return [{CHAIN: p.chain.round_taus, **{b: t.round_taus for b, t in p.trees.items()}} for p in report.prompts]


def register(client: CacheClient, args: argparse.Namespace, vocab: int) -> list[str]:
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(3, vocab - SPARE_ROWS, (args.prompts, args.prompt_len), generator=gen).tolist()
    ids = [p.prompt_id for p in client.register([{"token_ids": p} for p in prompts], max_new_tokens=args.response_len)]
    client.wait_ready(ids, timeout_s=600)
    return ids


def train(
    client: CacheClient, target: Any, ids: list[str], layers: list[int], runs: Path, args: argparse.Namespace
) -> list[Path]:
    """A 1-layer drafter trained on the cached features, saved at 4 steps; returns the checkpoints."""
    results = [client.hidden(pid, layers) for pid in ids]
    tensors = [r.to_torch() for r in results]
    data = Sequences([t.clone() for _, t in tensors], [h.float() for h, _ in tensors], [args.prompt_len] * len(ids))
    embed, lm_head = (t.float() for t in client.heads().to_torch())
    cfg = tiny_drafter_config(target.config, layers, block_size=args.block_size, num_layers=1)
    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(cfg, len(layers))
    trainer = TinyTrainer(drafter, data, embed, lm_head, lr=3e-3, seed=args.seed)
    paths = []
    for step in [args.train_steps * (i + 1) // 4 for i in range(4)]:
        trainer.run(step - trainer.global_step)
        paths.append(save_torch_checkpoint(runs / f"step_{step}.pt", drafter.eval(), global_step=step, epoch=0))
    return paths


def _trees(args: argparse.Namespace) -> DFlashOptions:
    """The DFlash options every path measures: the chain and DDTree-`--tree-budget`."""
    return DFlashOptions(tree_budgets=[args.tree_budget])


def per_checkpoint(
    client: CacheClient, target: Any, ckpt: LoadedCheckpoint, ids: list[str], tmp: Path, args: argparse.Namespace
) -> None:
    budgets = (args.tree_budget,)  # the checkpoint's options: loaded with them (`_trees`)
    options = EvalOptions(progress=False)
    heads = HeadsCache(tmp / "heads")
    drafter, layers = ckpt.drafter, list(ckpt.target_layer_ids)
    embed, lm_head = (t.float() for t in client.heads().to_torch())
    resident = FeatureCache(1 << 34)
    warm_report = evaluate(client, ckpt, ids, heads_cache=heads, options=options, features=resident)
    features = [resident.get(pid, layers) for pid in ids]
    prompts = [PromptFeatures(f.hidden.float(), f.token_ids.tolist(), f.metadata.prompt_len) for f in features if f]

    def every_anchor() -> Taus:
        return [all_anchor_taus(drafter, p.taps, p.token_ids, p.prompt_len, budgets, embed, lm_head) for p in prompts]

    def cold() -> EvalReport:
        return evaluate(client, ckpt, ids, heads_cache=heads, options=options, features=FeatureCache(1 << 34))

    def warm() -> EvalReport:
        return evaluate(client, ckpt, ids, heads_cache=heads, options=options, features=resident)

    def rerun_target() -> Taus:
        ids_t = torch.tensor([p.token_ids for p in prompts])
        taps = target_forward(target, ids_t, layers).taps  # [N, T, K*H]
        rerun = [PromptFeatures(t, p.token_ids, p.prompt_len) for t, p in zip(taps, prompts, strict=True)]
        return walk_prompts(drafter, rerun, embed, lm_head, tree_budgets=budgets, top_k=max(budgets), cost=DraftCost())

    reference, t_all = timed(every_anchor, args.repeats)
    cold_report, t_cold = timed(cold, args.repeats)
    warm_report, t_warm = timed(warm, args.repeats)
    rerun, t_target = timed(rerun_target, args.repeats)
    if not reference == report_taus(cold_report) == report_taus(warm_report) == rerun:
        raise SystemExit("per-round taus differ between the paths; the timings below would mean nothing")
    rounds = sum(len(t) for taus in reference for t in taus.values())
    anchors = sum(len(p.token_ids) - 1 - p.prompt_len for p in prompts)
    cost = warm_report.summary.cost
    assert cost is not None
    s = warm_report.summary
    print(
        f"chain tau {s.chain.mean_tau:.3f}, DDTree-{args.tree_budget} tau {s.trees[args.tree_budget].mean_tau:.3f}; "
        f"{rounds} rounds over both walks; per-round taus identical on all four paths"
    )
    print(f"{'per checkpoint':<42} {'wall s':>8} {'vs warm':>8} {'drafted blocks':>15} {'lm_head rows':>13}")
    rows = [
        ("all-anchor (features in memory)", t_all, anchors, anchors * (args.block_size - 1)),
        ("walk-driven, cold (HTTP, fetched ahead)", t_cold, cost.drafted_blocks, cost.lm_head_rows),
        ("walk-driven, warm (features resident)", t_warm, cost.drafted_blocks, cost.lm_head_rows),
        ("rerun the target, then walk-driven", t_target, cost.drafted_blocks, cost.lm_head_rows),
    ]
    for name, seconds, blocks, lm_rows in rows:
        print(f"{name:<42} {seconds:8.3f} {seconds / t_warm:8.2f} {blocks:15d} {lm_rows:13d}")
    live_rows = rounds * (args.block_size - 1)
    print(
        f"drafted blocks / rounds {cost.drafted_blocks / rounds:.2f}; lm_head rows / live loop's "
        f"{cost.lm_head_rows / live_rows:.2f}; cold fetch wait {cold_report.summary.cost.seconds.fetch:.3f} s "  # type: ignore[union-attr]
        f"of {t_cold:.3f} s"
    )


def sweep(url: str, paths: list[Path], ids: list[str], tmp: Path, args: argparse.Namespace) -> None:
    settings = EvaluateSettings(server=url, device="cpu", heads_cache=tmp / "heads", feature_cache_gb=0)
    with CacheClient(url) as client:

        def run(checkpoints: list[Path]) -> list[EvalReport]:
            wanted = [ids] * len(checkpoints)
            spec = EvalSpec(family_options=_trees(args))
            return evaluate_checkpoints(
                client, checkpoints, settings, spec, prompt_ids=wanted, progress=False, features=FeatureCache(0)
            )

        def one_pass() -> list[EvalReport]:
            return run(paths)

        def separately() -> list[EvalReport]:
            return [report for p in paths for report in run([p])]

        before = server_metric(url, HIDDEN_REQUESTS)
        together, t_one = timed(one_pass, args.repeats)
        one_requests = (server_metric(url, HIDDEN_REQUESTS) - before) / (args.repeats + 1)
        before = server_metric(url, HIDDEN_REQUESTS)
        apart, t_apart = timed(separately, args.repeats)
        apart_requests = (server_metric(url, HIDDEN_REQUESTS) - before) / (args.repeats + 1)
    if [report_taus(r) for r in together] != [report_taus(r) for r in apart]:
        raise SystemExit("a sweep scored differently from separate evaluations")
    print(f"\nsweep of {len(paths)} checkpoints x {len(ids)} prompts (no resident features between runs):")
    print(f"  one pass:    {one_requests:5.0f} GET /hidden, {t_one:7.3f} s")
    print(f"  separately:  {apart_requests:5.0f} GET /hidden, {t_apart:7.3f} s  ({t_apart / t_one:.2f}x the time)")


def threads(client: CacheClient, ckpt: Path, torch_default: int, tmp: Path, args: argparse.Namespace) -> None:
    """One long prompt's chain walk on torch's default threads and on eval-worker's default, alone and
    beside a CPU hog (a busy machine), side by side."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(3, args.vocab - SPARE_ROWS, (args.prompt_len,), generator=gen).tolist()
    [long] = client.register([{"token_ids": prompt}], max_new_tokens=args.long_response_len)
    client.wait_ready([long.prompt_id], timeout_s=1800)
    loaded = load_checkpoint(ckpt, client.model(), LoadRequest())  # the chain alone
    heads, resident = HeadsCache(tmp / "heads"), FeatureCache(1 << 34)
    options = EvalOptions(progress=False)
    chosen = cpu_threads(EvaluateSettings()) or torch_default

    def walk(n: int) -> Callable[[], EvalReport]:
        def run() -> EvalReport:
            torch.set_num_threads(n)
            return evaluate(client, loaded, [long.prompt_id], heads_cache=heads, options=options, features=resident)

        return run

    rows = []
    for load in ("alone", "beside a CPU hog"):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "alone" else None
        try:
            before, t_before = timed(walk(torch_default), args.repeats)
            after, t_after = timed(walk(chosen), args.repeats)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        if report_taus(before) != report_taus(after):
            raise SystemExit("the thread counts scored differently; the timings below would mean nothing")
        rows.append((load, t_before, t_after))
    torch.set_num_threads(args.threads)
    tokens = after.prompts[0].num_tokens
    print(f"\nCPU threads: one prompt of {tokens} tokens, DFlash chain only, features resident:")
    print(
        f"  {'':<18} {f'torch default ({torch_default})':>20} {f'eval-worker ({chosen})':>16} {'default / chosen':>17}"
    )
    for load, t_before, t_after in rows:
        print(f"  {load:<18} {t_before:18.2f} s {t_after:14.2f} s {t_before / t_after:16.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target-layers", type=int, default=12)
    p.add_argument("--target-hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--taps", type=int, default=3)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--tree-budget", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--response-len", type=int, default=128)
    p.add_argument("--long-response-len", type=int, default=2048, help="the threads section's one long response")
    p.add_argument("--train-steps", type=int, default=160)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, the same for every path")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch_default = torch.get_num_threads()  # what torch chose for this machine (OMP_NUM_THREADS, or its cores)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = build_tiny_model(
            tmp / "target", layers=args.target_layers, hidden=args.target_hidden, vocab=args.vocab, seed=args.seed
        )
        target = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        layers = default_layer_ids(args.target_layers, args.taps)
        with running_server(model, tmp / "store") as url, CacheClient(url) as client:
            ids = register(client, args, args.vocab)
            paths = train(client, target, ids, layers, tmp / "runs", args)
            c = target.config
            print(
                f"target {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}; 1-layer "
                f"drafter, block {args.block_size}, layers {layers}; {len(ids)} prompts x ({args.prompt_len} + "
                f"{args.response_len} greedy) tokens; {args.threads} torch thread(s); "
                f"median of {args.repeats}"
            )
            loaded = load_checkpoint(paths[-1], client.model(), LoadRequest(options=_trees(args)))
            per_checkpoint(client, target, loaded, ids, tmp, args)
            sweep(url, paths, ids, tmp, args)
            threads(client, paths[-1], torch_default, tmp, args)
    print()
    print(published_table())


if __name__ == "__main__":
    main()
