"""`eval-worker evaluate CHECKPOINT ...` and `eval-worker inspect CHECKPOINT`.

Exit codes: 0 ok; 2 the checkpoint is unusable or does not fit the target; 3 the cache server is
unreachable; 4 the server refused the request or served data that does not fit.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_SERVER = 2, 3, 4


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval-worker",
        description="Evaluate DFlash drafter checkpoints (chain and DDTree tau) on cached target hidden states.",
        epilog="Options can also be set as EVAL_WORKER_<OPTION>. Exit codes: 2 checkpoint refused, "
        "3 server unreachable, 4 server error or mismatched data.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("evaluate", help="measure acceptance length of one checkpoint")
    ev.add_argument("checkpoint", type=Path, help="HF DFlash directory or torch.save file")
    ev.add_argument("--server", help="cache server URL (default http://127.0.0.1:8000)")
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-prompts", action="store_true", help="every prompt registered on the server")
    which.add_argument("--prompts", type=lambda s: s.split(","), help="comma-separated prompt ids")
    ev.add_argument("--tree-budget", dest="tree_budgets", type=int, action="append", default=[],
                    help="DDTree budget (nodes, root excluded); repeat for several")  # fmt: skip
    ev.add_argument("--block-size", type=int, help="draft this block length instead of the config's")
    ev.add_argument("--target-layer-ids", type=_int_list, help="layer ids for a checkpoint that names none")
    ev.add_argument("--config", type=Path, help="drafter config.json for a torch.save file without one")
    ev.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ev.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="drafter math (float32)")
    ev.add_argument("--out", type=Path, help="write the JSON report (EvalReport) here")

    ins = sub.add_parser("inspect", help="what a checkpoint is and which target layers it needs")
    ins.add_argument("checkpoint", type=Path)
    ins.add_argument("--config", type=Path, help="drafter config.json for a torch.save file without one")
    ins.add_argument("--server", help="also resolve and check the layers against this server's target")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    from cache_server.client import ApiError, ProtocolError, ServerUnreachable
    from eval_worker.errors import CheckpointRefused, FeatureMismatch

    try:
        if args.command == "inspect":
            from eval_worker.inspect import inspect_checkpoint

            print(inspect_checkpoint(args.checkpoint, config_path=args.config, server=args.server))
            return 0
        return _evaluate(args)
    except CheckpointRefused as e:
        print(f"eval-worker: checkpoint {args.checkpoint} refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ServerUnreachable as e:
        print(f"eval-worker: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (ApiError, ProtocolError, FeatureMismatch, TimeoutError, ValueError, ValidationError) as e:
        print(f"eval-worker: {e}", file=sys.stderr)
        return EXIT_SERVER


def _evaluate(args: argparse.Namespace) -> int:
    from cache_server.client import CacheClient
    from eval_worker.report_table import format_report
    from eval_worker.run import run_evaluation
    from eval_worker.settings import WorkerSettings

    given: dict[str, Any] = {k: getattr(args, k) for k in ("server", "device", "dtype") if getattr(args, k)}
    settings = WorkerSettings(**given)
    with CacheClient(settings.server, token=settings.token) as client:
        report = run_evaluation(
            client,
            args.checkpoint,
            settings,
            prompt_ids=None if args.all_prompts else args.prompts,
            tree_budgets=args.tree_budgets,
            layer_ids=args.target_layer_ids,
            block_size=args.block_size,
            config_path=args.config,
        )
    print(format_report(report))
    if args.out:
        args.out.write_text(report.model_dump_json(indent=1))
        print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
