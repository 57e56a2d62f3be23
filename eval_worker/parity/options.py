"""`eval-worker parity`'s own options (besides the evaluation settings): the engine, the prompts, and at
T > 0 the sampling setting, the samples, how the engine drafts and the probe. No heavy imports: the
command line loads this before any command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval_worker.cli_options import sampling_options
from schemas.sampling import DRAFT_SAMPLING, SamplingParams

PROBE_TEMPERATURE = 1e-3  # the probe's default (eval_worker.parity.probe): kept here so that --help loads no torch


def add_parity_options(p: argparse.ArgumentParser) -> None:
    """The engine and prompt options, then the sampling group (all default to today's T = 0 parity)."""
    p.add_argument(
        "--engine",
        required=True,
        help="URL of a vLLM serving the target with this checkpoint as its speculative config",
    )
    p.add_argument("--set", dest="sets", action="append", help="the prompts of this set (repeatable; default: all)")
    p.add_argument("--limit", type=int, help="the first N of those prompts")
    p.add_argument("--out", type=Path, help="write the JSON report (ParityReport) here")
    s = p.add_argument_group("sampling (T > 0: the engine's sampled outputs, registered and walked offline)")
    sampling_options(s)
    s.add_argument(
        "--draft-sampling",
        choices=DRAFT_SAMPLING,
        default="greedy",
        help="how the engine drafts (its speculative config's draft_sample_method): greedy (vLLM's default) is "
        "compared exactly per prompt, probabilistic over all rounds against the exact expectation",
    )
    s.add_argument(
        "--probe-temperature",
        type=float,
        default=PROBE_TEMPERATURE,
        help=f"the probe's tiny temperature (default {PROBE_TEMPERATURE:g}; 0.01 for a bf16 engine)",
    )
    s.add_argument("--probe-prompts", type=int, default=2, help="prompts the probe sends (default 2)")


def sampling_of(args: argparse.Namespace) -> SamplingParams:
    """The requests' setting, its seed the first sample's (ValueError for options that mean nothing at T = 0)."""
    if args.samples < 1 or args.probe_prompts < 1:
        raise ValueError("--samples and --probe-prompts must be at least 1")
    if args.temperature == 0:
        if args.samples != 1 or args.draft_sampling != "greedy":
            raise ValueError("--samples and --draft-sampling probabilistic need --temperature > 0 (T = 0 is greedy)")
        return SamplingParams()
    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed
    )
