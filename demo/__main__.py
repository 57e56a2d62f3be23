"""The end-to-end demo on a tiny local model: `./dev demo` (or `python -m demo`).

Builds a tiny random Qwen3 target, starts a real cache server, registers prompts whose responses
the target generates, trains a tiny DFlash drafter on features fetched from the cache and saves it
at two steps, then evaluates both checkpoints with the real `eval-worker evaluate` command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig

from cache_server.child import running_server
from cache_server.client import CacheClient
from cache_server.tiny_model import build_tiny_model
from eval_worker.checkpoint import save_hf_checkpoint, save_torch_checkpoint
from eval_worker.drafter import DFlashDrafter
from eval_worker.layer_ids import default_layer_ids
from eval_worker.train_tiny import Sequences, TinyTrainer, tiny_drafter_config
from schemas.report import EvalReport

TEXTS = [
    "def fib(n):",
    "The quick brown fox",
    "import numpy as np",
    "Question: what is the capital",
    "class Stack:",
    "for i in range(10):",
    "Speculative decoding drafts",
    "print(x.sum(axis=0))",
]


def _say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def fetch_sequences(client: CacheClient, prompt_ids: list[str], layers: list[int]) -> Sequences:
    """Training data straight from the cache: the taps the drafter will read, and the tokens."""
    results = [client.hidden(pid, layers) for pid in prompt_ids]
    return Sequences(
        token_ids=[r.token_ids.clone() for r in results],
        taps=[r.hidden.float() for r in results],
        prompt_lens=[r.metadata.prompt_len for r in results],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--workdir", type=Path, default=Path("demo-out"))
    p.add_argument("--layers", type=int, default=8, help="target decoder layers")
    p.add_argument("--new-tokens", type=int, default=48, help="generated response length per prompt")
    p.add_argument("--steps", type=int, nargs=2, default=[30, 200], help="the two checkpoint steps")
    args = p.parse_args(argv)
    started = time.perf_counter()
    torch.manual_seed(0)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)

    _say(f"building a tiny Qwen3 target ({args.layers} layers) in {args.workdir / 'target'}")
    target = build_tiny_model(args.workdir / "target", layers=args.layers, hidden=64, vocab=512)

    with running_server(target, args.workdir / "store") as url, CacheClient(url) as client:
        info = client.model()
        _say(f"cache server up at {url}: {info.num_layers} layers, hidden {info.hidden_size}, {info.fingerprint}")
        registered = client.register([{"text": t, "name": t} for t in TEXTS], max_new_tokens=args.new_tokens)
        ids = [r.prompt_id for r in registered]
        client.wait_ready(ids, timeout_s=300)
        print(f"{len(ids)} prompts registered; the target generated {args.new_tokens}-token greedy responses")

        layers = default_layer_ids(info.num_layers, 3)
        _say(f"training a tiny DFlash drafter on cached layers {layers} (the DFlash formula for 3 taps)")
        heads = client.heads()
        train = fetch_sequences(client, ids[:6], layers)  # the last two prompts stay unseen
        cfg = tiny_drafter_config(AutoConfig.from_pretrained(target), layers, block_size=4)
        drafter = DFlashDrafter(cfg, len(layers))
        trainer = TinyTrainer(drafter, train, heads.embed_tokens.float(), heads.lm_head.float(), lr=1e-3)
        runs = args.workdir / "runs"
        checkpoints = []
        for step in args.steps:
            loss = trainer.run(step - trainer.global_step)
            path = save_torch_checkpoint(runs / f"step_{step}.pt", drafter, global_step=step, epoch=0)
            checkpoints.append(path)
            print(f"step {step}: loss {loss:.3f} -> {path}")
        checkpoints.append(save_hf_checkpoint(runs / f"hf_step_{args.steps[-1]}", drafter))
        print(f"also saved the last step in the published HF layout: {checkpoints[-1]}")

        reports = []
        for ckpt in checkpoints:
            out = ckpt.with_suffix(".json") if ckpt.is_file() else ckpt.with_name(ckpt.name + ".json")
            _say(f"eval-worker evaluate {ckpt.name}")
            cmd = [sys.executable, "-m", "eval_worker.cli", "evaluate", str(ckpt), "--server", url]
            cmd += ["--all-prompts", "--tree-budget", "4", "--tree-budget", "8", "--out", str(out)]
            subprocess.run(cmd, check=True, env=_env(args.workdir))
            reports.append(EvalReport.model_validate_json(out.read_text()))

    _say("summary")
    for r in reports:
        trees = "  ".join(f"DDTree-{b} {s.mean_tau:.2f}" for b, s in sorted(r.summary.trees.items()) if s.mean_tau)
        print(
            f"{Path(r.checkpoint_path).name:<16} step {r.step!s:>4}  chain tau {r.summary.chain.mean_tau:.2f}  {trees}"
        )
    print(f"\ndone in {time.perf_counter() - started:.0f} s; everything is under {args.workdir}/")
    return 0


def _env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "EVAL_WORKER_HEADS_CACHE": str(workdir / "heads")}


if __name__ == "__main__":
    sys.exit(main())
