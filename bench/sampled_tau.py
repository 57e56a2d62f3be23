"""Acceptance at the temperature served at: the demo's drafters at T = 0, 0.6 and 1.0, greedy and
probabilistic drafting, each tau with its standard error over prompts; and what each costs.

Run from the repository root after `./dev demo`: `.venv/bin/python -m bench.sampled_tau [--demo demo-out]`.
A real server over the demo's target (a fresh store) registers the demo's prompts with responses
greedy (T = 0) and sampled at T = 0.6 and T = 1.0 (top-p 0.95, `--samples` each); every demo
checkpoint is evaluated over each setting's prompts with `--draft-sampling probabilistic` (the chain walk
is greedy drafting; the expectation is probabilistic drafting; the MTP head greedily only), and what
each costs in drafted blocks (drafter forwards of one anchor) beside a greedy-only evaluation.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cache_server.client import CacheClient
from demo.__main__ import TEXTS
from eval_worker.cli import main as eval_worker
from schemas.prompts import GenerateSpec
from schemas.report import EvalReport
from testing.servers import running_server

SETTINGS = {"T=0": 0.0, "T=0.6 top_p=0.95": 0.6, "T=1 top_p=0.95": 1.0}  # top-p 0.95 at T > 0


def evaluate(url: str, checkpoint: Path, ids: list[str], out: Path, drafting: str) -> tuple[EvalReport, float]:
    """The checkpoint's report over `ids` (the chain: trees are measured at T = 0 alone), and its seconds."""
    argv = ["evaluate", str(checkpoint), "--server", url, "--prompts", ",".join(ids), "--device", "cpu"]
    started = time.perf_counter()
    if eval_worker([*argv, "--draft-sampling", drafting, "--out", str(out)]) != 0:
        raise SystemExit(f"evaluating {checkpoint} against {url} failed")
    return EvalReport.model_validate_json(out.read_text()), time.perf_counter() - started


def _cell(tau: float | None, stderr: float | None) -> str:
    return "-" if tau is None else f"{tau:.3f} ± {stderr or 0:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--demo", type=Path, default=Path("demo-out"), help="a `python -m demo` output directory")
    p.add_argument("--new-tokens", type=int, default=48, help="response tokens per prompt (the demo's default)")
    p.add_argument("--samples", type=int, default=4, help="sampled responses per prompt and setting")
    args = p.parse_args()
    target, checkpoints = args.demo / "target", sorted((args.demo / "runs").iterdir())
    work = Path(tempfile.mkdtemp(prefix="sampled-tau-"))
    os.environ["EVAL_WORKER_HEADS_CACHE"] = str(work / "heads")
    specs = [{"text": t} for t in TEXTS]
    with running_server(target, work / "store") as url, CacheClient(url) as client:
        ids: dict[str, list[str]] = {}
        for name, t in SETTINGS.items():
            sampled = {"temperature": t, "top_p": 0.95, "samples": args.samples} if t else {}
            generate = GenerateSpec.model_validate({"max_new_tokens": args.new_tokens, **sampled})
            ids[name] = [r.prompt_id for r in client.register(specs, generate=generate)]
        client.wait_ready([pid for group in ids.values() for pid in group], timeout_s=900)
        print(f"{len(TEXTS)} prompts x {args.new_tokens} tokens; {args.samples} samples per prompt at T > 0\n")
        head = f"{'checkpoint':<18} {'setting':<18} {'chain (greedy drafting)':>24} {'probabilistic drafting':>24}"
        print(head + f" {'blocks':>9} {'blocks':>9}")  # drafter forwards: greedy drafting alone, and both
        for ckpt in checkpoints:
            for name, group in ids.items():
                out = f"{ckpt.name}-{name.replace(' ', '_')}"
                greedy, _ = evaluate(url, ckpt, group, work / f"{out}-greedy.json", "greedy")
                report = greedy  # the demo's MTP head: probabilistic drafting is not evaluated for MTP heads
                if not ckpt.name.startswith("mtp"):
                    report, _ = evaluate(url, ckpt, group, work / f"{out}-probabilistic.json", "probabilistic")
                chain, prob = report.summary.chain, report.summary.probabilistic
                expected = _cell(prob.mean_tau, prob.stderr) if prob is not None else "-"
                blocks = [r.summary.cost.drafted_blocks if r.summary.cost else 0 for r in (greedy, report)]
                print(
                    f"{ckpt.name:<18} {name:<18} {_cell(chain.mean_tau, chain.stderr):>24} {expected:>24} "
                    f"{blocks[0]:>9} {blocks[1]:>9}"
                )


if __name__ == "__main__":
    main()
