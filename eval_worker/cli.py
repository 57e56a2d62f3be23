"""`eval-worker evaluate | inspect | serve | submit | watch | compare`.

Exit codes: 0 ok; 1 bad usage (options, device, nothing to do); 2 the checkpoint is unusable or
does not fit the target; 3 the cache server is unreachable; 4 the server refused the request or
served data that does not fit; 5 a job failed (`submit --wait`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_SERVER = 1, 2, 3, 4


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _job_options(p: argparse.ArgumentParser) -> None:
    """What to evaluate: shared by `evaluate`, `submit` and `watch`."""
    p.add_argument("--tree-budget", dest="tree_budgets", type=int, action="append", default=[],
                   help="DDTree budget (nodes, root excluded); repeat for several")  # fmt: skip
    p.add_argument("--block-size", type=int, help="draft this block length instead of the config's")
    p.add_argument("--target-layer-ids", type=_int_list, help="layer ids for a checkpoint that names none")


def _server_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help="cache server URL (default http://127.0.0.1:8000)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval-worker",
        description="Evaluate DFlash drafter checkpoints (chain and DDTree tau) on cached target hidden states.",
        epilog="Options can also be set as EVAL_WORKER_<OPTION>. Exit codes: 1 bad usage, 2 checkpoint refused, "
        "3 server unreachable, 4 server error or mismatched data, 5 job failed.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("evaluate", help="measure acceptance length of one checkpoint, here")
    ev.add_argument("checkpoint", type=Path, help="HF DFlash directory or torch.save file")
    _server_option(ev)
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-prompts", action="store_true", help="every prompt registered on the server")
    which.add_argument("--prompts", type=lambda s: s.split(","), help="comma-separated prompt ids")
    _job_options(ev)
    ev.add_argument("--config", type=Path, help="drafter config.json for a torch.save file without one")
    ev.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ev.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="drafter math (float32)")
    ev.add_argument("--out", type=Path, help="write the JSON report (EvalReport) here")

    ins = sub.add_parser("inspect", help="what a checkpoint is and which target layers it needs")
    ins.add_argument("checkpoint", type=Path)
    ins.add_argument("--config", type=Path, help="drafter config.json for a torch.save file without one")
    _server_option(ins)

    srv = sub.add_parser("serve", help="claim evaluation jobs from the cache server, one at a time")
    _server_option(srv)
    srv.add_argument("--device", choices=["auto", "cpu", "cuda"])
    srv.add_argument("--poll-interval", dest="poll_interval", type=float, help="seconds between claims (2)")
    srv.add_argument("--lease-s", dest="lease_s", type=float, help="job lease, renewed while working (60)")
    srv.add_argument("--name", help="worker name recorded on jobs (host:pid)")

    sub_ = sub.add_parser("submit", help="queue a checkpoint evaluation job on the cache server")
    sub_.add_argument("checkpoint", type=Path)
    _server_option(sub_)
    sub_.add_argument("--prompts", type=lambda s: s.split(","), help="prompt ids (default: all)")
    _job_options(sub_)
    root_help = "local directory the server knows as its --checkpoint-root; paths are sent relative to it"
    sub_.add_argument("--checkpoint-root", dest="checkpoint_root", type=Path, help=root_help)
    sub_.add_argument("--wait", action="store_true", help="wait for the job and print its report")

    wat = sub.add_parser("watch", help="submit each checkpoint that finishes writing under DIR")
    wat.add_argument("dir", type=Path)
    _server_option(wat)
    _job_options(wat)
    wat.add_argument("--checkpoint-root", dest="checkpoint_root", type=Path, help="as for submit")
    wat.add_argument("--interval", type=float, default=10.0, help="seconds between looks (10)")
    wat.add_argument("--once", action="store_true", help="look twice (to see which files are finished), then exit")

    cmp_ = sub.add_parser("compare", help="table (and plot) of reports by step")
    cmp_.add_argument("reports", type=Path, nargs="*", help="EvalReport JSON files")
    cmp_.add_argument("--server", help="also take every finished job's report from this server")
    cmp_.add_argument("--plot", type=Path, help="write a PNG of tau vs step and the acceptance curve")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    from cache_server.client import ApiError, ProtocolError, ServerUnreachable
    from eval_worker import commands
    from eval_worker.errors import CheckpointRefused, FeatureMismatch

    try:
        return int(getattr(commands, args.command)(args))
    except CheckpointRefused as e:
        print(f"eval-worker: checkpoint {args.checkpoint} refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ServerUnreachable as e:
        print(f"eval-worker: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (ApiError, ProtocolError, FeatureMismatch, TimeoutError) as e:
        print(f"eval-worker: {e}", file=sys.stderr)
        return EXIT_SERVER
    except (ValueError, ValidationError) as e:
        print(f"eval-worker: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
