"""The end-to-end demo on a tiny local model: `./dev demo` (or `python -m demo`).

Builds a tiny random Qwen3 target (its next-token distribution peaked, as a trained model's is),
starts a real cache server, registers prompts (two sets, code and prose) whose responses the target
generates greedily (T = 0) and sampled at T = 0.6 (top-p 0.95, two samples each), trains a tiny DFlash
drafter on features fetched from the cache and saves it at two steps, trains a tiny EAGLE-3 drafter (a
draft vocab of half the target's, EAGLE-3's default taps) and saves it in the EAGLE layout, trains an
MTP head on the target's last layer (in Qwen3.5's layout: the Qwen3 target ships none) and saves it as
an MTP-only checkpoint, submits every checkpoint as a job (probabilistic drafting too, where the family
has it), runs an eval worker until they are done, then prints the leaderboard of the three families,
per sampling setting, and writes the tau plot.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient, JobsClient
from eval_worker.checkpoints.layer_ids import default_layer_ids, eagle3_default_layer_ids
from eval_worker.evaluation.walk_types import TargetNorm
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.mtp.drafter import MtpDrafter
from eval_worker.families.mtp.layouts import LAYOUTS
from eval_worker.reports.compare import compare_json, compare_table
from eval_worker.reports.plot import plot
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions
from schemas.jobs import JobStatus
from schemas.prompts import GenerateSpec
from testing.browser import CHROMIUM, headless
from testing.checkpoints import engine_keys, save_hf_checkpoint
from testing.eagle3 import eagle3_config, frequent_d2t, random_eagle3, save_eagle3, train_eagle3
from testing.mtp_targets import head_config_for
from testing.mtp_trainer import save_mtp_only, train_mtp_head
from testing.servers import running_server
from testing.tiny_trainer import Sequences, TinyTrainer, tiny_drafter_config

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
CODE = {0, 2, 4, 5, 7}  # the rest are prose: two prompt sets, reported apart
HELD_OUT = 2  # the last prompts are never trained on
LOGIT_SCALE = 8.0  # lm_head x 8: a few likely tokens per position (a random model's distribution is flat)
TEMPERATURE, TOP_P, SAMPLES = 0.6, 0.95, 2  # the setting the demo's sets are also sampled at
MTP_STEPS = 2  # chain drafts per round, the one head reused as vLLM runs it


def _say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def fetch_sequences(client: CacheClient, prompt_ids: list[str], layers: list[int]) -> Sequences:
    """Training data straight from the cache: the taps the drafter will read, and the tokens."""
    results = [client.hidden(pid, layers) for pid in prompt_ids]
    tensors = [r.to_torch() for r in results]  # (hidden, token_ids) views of the served bytes
    return Sequences(
        token_ids=[ids.clone() for _, ids in tensors],
        taps=[hidden.float() for hidden, _ in tensors],
        prompt_lens=[r.metadata.prompt_len for r in results],
    )


def train_checkpoints(client: CacheClient, target: Path, prompt_ids: list[str], steps: list[int], runs: Path) -> None:
    info = client.model()
    layers = default_layer_ids(info.num_layers, 3)
    _say(f"training a tiny DFlash drafter on cached layers {layers} (the DFlash formula for 3 taps)")
    embed, lm_head = client.heads().to_torch()
    train = fetch_sequences(client, prompt_ids[:-HELD_OUT], layers)
    config = AutoConfig.from_pretrained(target)
    drafter = DFlashDrafter(tiny_drafter_config(config, layers, block_size=4), len(layers))
    trainer = TinyTrainer(drafter, train, embed.float(), lm_head.float(), lr=1e-3)
    for step in steps:
        loss = trainer.run(step - trainer.global_step)
        path = save_hf_checkpoint(runs / f"dflash_step_{step}", drafter, extra=engine_keys(config), global_step=step)
        print(f"step {step}: loss {loss:.3f} -> {path}", flush=True)


def train_eagle3_checkpoint(client: CacheClient, target: Path, prompt_ids: list[str], steps: int, runs: Path) -> None:
    info = client.model()
    layers = list(eagle3_default_layer_ids(info.num_layers))
    _say(f"training a tiny EAGLE-3 drafter on cached layers {layers} (its defaults: layer inputs 2, L//2, L-3)")
    embed, _ = client.heads().to_torch()
    train = fetch_sequences(client, prompt_ids[:-HELD_OUT], layers)
    config = AutoConfig.from_pretrained(target)
    d2t = frequent_d2t(train.token_ids, config.vocab_size // 2, config.vocab_size)
    drafter = random_eagle3(eagle3_config(config, draft_vocab_size=config.vocab_size // 2), len(layers), d2t=d2t)
    loss = train_eagle3(drafter, train.token_ids, train.taps, embed.float(), steps)
    path = save_eagle3(runs / f"eagle3_step_{steps}", drafter, "eagle", hf_step=steps)
    print(f"step {steps}: loss {loss:.3f} -> {path} (EAGLE layout, draft vocab {drafter.cfg.draft_vocab_size})")


def train_mtp_checkpoint(client: CacheClient, target: Path, prompt_ids: list[str], steps: int, runs: Path) -> None:
    info = client.model()
    last = info.num_layers - 1
    _say(f"training a tiny MTP head on cached layer {last} (the target's last, normed) in Qwen3.5's layout")
    heads = client.heads()
    embed, lm_head = (t.float() for t in heads.to_torch())
    norm = TargetNorm.served(heads)
    if norm is None:
        raise RuntimeError("the demo target's final norm is an RMSNorm, which the server serves: it served none")
    train = fetch_sequences(client, prompt_ids[:-HELD_OUT], [last])
    config = head_config_for(AutoConfig.from_pretrained(target))
    head = MtpDrafter(LAYOUTS["qwen3_5"], config)
    loss = train_mtp_head(head, [norm(t) for t in train.taps], train.token_ids, embed, lm_head, steps, lr=3e-3)
    path = save_mtp_only(runs / f"mtp_step_{steps}", config.to_dict(), head, step=steps)
    print(f"step {steps}: loss {loss:.3f} -> {path} (MTP-only checkpoint, {MTP_STEPS} chain steps per round)")


def _spec(checkpoint: str) -> EvalSpec:
    """A demo job's spec: both sets, trees where the family has them, probabilistic drafting where it is evaluated."""
    sets = ["code", "prose"]
    if checkpoint.startswith("mtp"):
        return EvalSpec(sets=sets, family_options=MtpOptions(steps=MTP_STEPS))
    if checkpoint.startswith("eagle3"):
        return EvalSpec(sets=sets, draft_sampling="probabilistic", family_options=Eagle3Options(eagle_trees=["4,3,16"]))
    return EvalSpec(sets=sets, draft_sampling="probabilistic", family_options=DFlashOptions(tree_budgets=[4, 8]))


def run_jobs(url: str, runs: Path, workdir: Path) -> None:
    """Submit every checkpoint under `runs` (`_spec`), and let one real `eval-worker serve` process do them."""
    with CacheClient(url) as client:
        jobs = JobsClient(client)
        submitted = [jobs.submit(p.name, spec=_spec(p.name)) for p in sorted(runs.iterdir())]
        for job in submitted:
            print(f"submitted job {job.job_id} for {job.checkpoint_relative}")
        _say("eval-worker serve (one worker process claims the jobs)")
        cmd = [sys.executable, "-m", "eval_worker.cli", "serve", "--server", url, "--poll-interval", "0.5"]
        env = {**os.environ, "EVAL_WORKER_HEADS_CACHE": str(workdir / "heads"), "EVAL_WORKER_DEVICE": "cpu"}
        worker = subprocess.Popen(cmd, env=env)
        try:
            finals = [jobs.wait(j.job_id, timeout_s=600, poll_s=0.5) for j in submitted]
        finally:
            worker.send_signal(signal.SIGTERM)  # finishes the job in hand, then exits
            worker.wait(timeout=60)
        failed = [f for f in finals if f.status != JobStatus.done]
        if failed:
            raise RuntimeError(f"jobs failed: {[(f.checkpoint_relative, f.error) for f in failed]}")


SCREENSHOT_WINDOW = (1440, 1050)  # the page's width and height in the screenshot
NO_CHROMIUM = "Chromium is not installed (Debian/Ubuntu: apt-get install chromium)"


def _screenshot(url: str, out: Path, wanted: bool | None) -> None:
    """The leaderboard page as headless Chromium renders it; `wanted` None: when Chromium is installed,
    saying so when it is not (main refuses --screenshot without it before any work)."""
    if wanted is False:
        print("page screenshot: skipped (--no-screenshot)")
        return
    if CHROMIUM is None:
        print(
            f"page screenshot: SKIPPED, {NO_CHROMIUM}; install it and rerun (--screenshot makes its absence an error)"
        )
        return
    headless(url + "/", f"--screenshot={out.resolve()}", window=SCREENSHOT_WINDOW)
    print(f"page screenshot: {out}")


def register_prompts(url: str, client: CacheClient, new_tokens: int) -> list[str]:
    """The demo's prompts in two sets, with greedy and sampled responses, ready -> the greedy ones' ids."""
    info = client.model()
    _say(f"cache server up at {url}: {info.num_layers} layers, hidden {info.hidden_size}, {info.fingerprint}")
    specs = [{"text": t, "name": t, "sets": ["code" if i in CODE else "prose"]} for i, t in enumerate(TEXTS)]
    ids = [r.prompt_id for r in client.register(specs, max_new_tokens=new_tokens)]
    generate = GenerateSpec(max_new_tokens=new_tokens, temperature=TEMPERATURE, top_p=TOP_P, samples=SAMPLES)
    sampled = client.register(specs, generate=generate)
    client.wait_ready(ids + [r.prompt_id for r in sampled], timeout_s=300)
    print(
        f"{len(ids)} prompts registered; the target generated {new_tokens}-token greedy responses, "
        f"and {len(sampled)} sampled at T = {TEMPERATURE}, top-p {TOP_P}"
    )
    counts = ", ".join(f"{s.name} {s.ready}/{s.total} ready" for s in client.sets().sets)
    print(f"prompt sets (GET /sets): {counts}")
    return ids


def show_leaderboard(url: str, client: CacheClient, workdir: Path, screenshot: bool | None) -> None:
    """The finished jobs' table (and every number as JSON), the tau plot and (with Chromium) the page's
    screenshot."""
    _say("leaderboard (eval-worker compare --server ...)")
    jobs = JobsClient(client)
    reports = [jobs.report(j.job_id) for j in jobs.jobs(JobStatus.done)]
    print(compare_table(reports))
    (workdir / "leaderboard.json").write_text(compare_json(reports))
    print(f"every column (eval-worker compare --json): {workdir / 'leaderboard.json'}")
    plot(reports, workdir / "tau.png")
    print(f"plot: {workdir / 'tau.png'}")
    _screenshot(url, workdir / "leaderboard.png", screenshot)
    print(f"\nleaderboard page: {url}/  (served until the demo ends; --keep-serving keeps it up)")


DEMO_MARKER = ".made-by-demo"
DEFAULT_WORKDIR = Path("demo-out")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="replaced on every run (default: demo-out)")
    p.add_argument("--layers", type=int, default=8, help="target decoder layers")
    p.add_argument("--new-tokens", type=int, default=48, help="generated response length per prompt")
    p.add_argument("--steps", type=int, nargs=2, default=[30, 200], help="the two checkpoint steps")
    p.add_argument("--keep-serving", action="store_true", help="keep the server (and its page) up until Ctrl-C")
    p.add_argument(
        "--screenshot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="save the leaderboard page's screenshot (needs Chromium); default: when Chromium is installed, "
        "saying so when it is not",
    )
    args = p.parse_args(argv)
    if args.screenshot and CHROMIUM is None:
        p.error(f"--screenshot: {NO_CHROMIUM}; or leave --screenshot out to run without it")
    if args.layers < 7:
        p.error("--layers must be >= 7: EAGLE-3's default taps (layer inputs 2, L//2, L-3) must be distinct")
    marker = args.workdir / DEMO_MARKER
    ours = marker.exists() or args.workdir == DEFAULT_WORKDIR  # demo-out is the demo's own (and git-ignored)
    if args.workdir.exists() and any(args.workdir.iterdir()) and not ours:
        p.error(f"--workdir {args.workdir} is not empty and was not made by the demo: name a new or empty directory")
    started = time.perf_counter()
    torch.manual_seed(0)
    shutil.rmtree(args.workdir, ignore_errors=True)  # a previous demo's output, nothing else
    runs = args.workdir / "runs"
    runs.mkdir(parents=True)
    marker.write_text("made by `python -m demo`; the next run replaces this directory\n")

    _say(f"building a tiny Qwen3 target ({args.layers} layers) in {args.workdir / 'target'}")
    # head_dim 32: the smallest vLLM's CPU attention takes, so that vLLM can serve the demo's drafters too
    target = build_tiny_model(
        args.workdir / "target", layers=args.layers, hidden=128, head_dim=32, vocab=512, logit_scale=LOGIT_SCALE
    )

    server_args = ("--checkpoint-root", str(runs))
    with running_server(target, args.workdir / "store", *server_args) as url, CacheClient(url) as client:
        ids = register_prompts(url, client, args.new_tokens)
        train_checkpoints(client, target, ids, args.steps, runs)
        train_eagle3_checkpoint(client, target, ids, args.steps[1], runs)
        train_mtp_checkpoint(client, target, ids, args.steps[1], runs)
        run_jobs(url, runs, args.workdir)

        show_leaderboard(url, client, args.workdir, args.screenshot)
        if args.keep_serving:
            print("serving; Ctrl-C to stop", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    print(f"\ndone in {time.perf_counter() - started:.0f} s; everything is under {args.workdir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
