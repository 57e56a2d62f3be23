"""`python -m demo.train_dflash`: train a tiny DFlash drafter on the cached states of one prompt set and
save it at the steps asked, as vLLM loads it (the demo's own drafter, `demo.__main__.train_checkpoints`).

For the tutorials: it makes checkpoints to evaluate on a tiny target in a minute; it is not a training
recipe (a tiny block-diffusion loop over the set's greedy responses, the last two prompts held out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cache_server.client import CacheClient
from demo.__main__ import HELD_OUT, train_checkpoints


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.train_dflash", description=__doc__)
    p.add_argument("--server", required=True, help="the cache server (e.g. http://127.0.0.1:8000)")
    p.add_argument("--target", type=Path, required=True, help="the target's directory, as the server serves it")
    p.add_argument("--set", dest="set_name", required=True, help="the prompt set to train on")
    p.add_argument("--steps", type=int, nargs="+", required=True, help="save a checkpoint at each of these steps")
    p.add_argument("--out", type=Path, required=True, help="checkpoints go to OUT/dflash_step_<N>")
    args = p.parse_args(argv)
    if sorted(set(args.steps)) != args.steps or args.steps[0] < 1:
        p.error("--steps must be increasing and positive (e.g. --steps 20 80)")
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny drafter's matrices: more threads only wait on each other (5x slower here)
    with CacheClient(args.server) as client:
        ids = [s.prompt_id for s in client.prompts(set_name=args.set_name)]
        if len(ids) <= HELD_OUT:
            p.error(f"--set {args.set_name} has {len(ids)} prompts: it needs more than {HELD_OUT} (held out)")
        client.wait_ready(ids)
        train_checkpoints(client, args.target, ids, args.steps, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
