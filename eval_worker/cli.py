"""`eval-worker evaluate | parity | doctor | inspect | serve | submit | watch | compare | prompts add | export`.

Settings-backed options are generated from the models in `settings.py` (so each is also an
EVAL_WORKER_ variable); the rest are this command line's own. Exit codes: `exit_codes.ExitCode`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from eval_worker import checkpoint_commands, commands
from eval_worker.cli_options import (
    FamilyFlags,
    command,
    config_args,
    eval_spec,
    export_options,
    job_options,
    sampling_options,
)
from eval_worker.exit_codes import ExitCode, exit_codes_line
from eval_worker.parity.options import add_parity_options
from eval_worker.settings import (
    ConnectionSettings,
    EvaluateSettings,
    LookupSettings,
    SubmitSettings,
    WorkerSettings,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval-worker",
        description="Evaluate drafter checkpoints (DFlash, EAGLE-3 and MTP: chain and tree tau) on cached "
        "target hidden states.",
        epilog="Options can also be set as EVAL_WORKER_<OPTION>. " + exit_codes_line(),
    )
    sub = p.add_subparsers(dest="command", required=True)

    _evaluate_command(sub)
    _checkpoint_commands(sub)
    _job_commands(sub)
    _prompts_command(sub)
    _compare_command(sub)
    _export_command(sub)
    return p


def _evaluate_command(sub: Any) -> None:
    """`evaluate`: checkpoints measured here, one pass over the prompts."""
    ev = command(
        sub,
        "evaluate",
        "measure acceptance length of checkpoints here (several: one pass)",
        commands.evaluate,
        EvaluateSettings,
        positional=None,
    )
    ev.add_argument(
        "checkpoints",
        type=Path,
        nargs="+",
        help="drafter checkpoints (DFlash, EAGLE-3 or MTP): HF directories or torch.save files",
    )
    which = ev.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-prompts", action="store_true", help="every prompt registered on the server")
    which.add_argument("--prompts", type=lambda s: s.split(","), help="comma-separated prompt ids")
    which.add_argument(
        "--set",
        dest="sets",
        action="append",
        help="the prompts of this set (repeatable); the report is also summarized per set",
    )
    job_options(ev)
    outs = ev.add_mutually_exclusive_group()
    outs.add_argument("--out", type=Path, help="write the JSON report (EvalReport) of one checkpoint here")
    outs.add_argument("--out-dir", type=Path, help="write each checkpoint's report as DIR/<checkpoint name>.json")


def _checkpoint_commands(sub: Any) -> None:
    """`parity`, `doctor` and `inspect`: one checkpoint against an engine, the cache, or itself."""
    par = command(
        sub,
        "parity",
        "does a serving engine's live speculative decoding agree with the offline rounds?",
        checkpoint_commands.parity,
        EvaluateSettings,
        positional="checkpoint",
    )
    add_parity_options(par)
    config_args(par)

    doc = command(
        sub,
        "doctor",
        "the checkpoint's layers against the usual wrong readings, on a few prompts",
        checkpoint_commands.doctor,
        EvaluateSettings,
        positional="checkpoint",
    )
    doc.add_argument("--limit", type=int, default=8, help="prompts to evaluate each reading on (default 8)")
    config_args(doc)

    ins = command(
        sub,
        "inspect",
        "what a checkpoint is and which target layers it needs",
        checkpoint_commands.inspect,
        LookupSettings,
        positional="checkpoint",
    )
    config_args(ins)


def _job_commands(sub: Any) -> None:
    """`serve`, `submit`, `cancel` and `watch`: checkpoints evaluated as jobs of the server."""
    command(
        sub,
        "serve",
        "claim evaluation jobs from the cache server, one at a time",
        commands.serve,
        WorkerSettings,
        positional=None,
    )
    sbm = command(
        sub,
        "submit",
        "queue a checkpoint evaluation job on the cache server",
        commands.submit,
        SubmitSettings,
        positional="checkpoint",
    )
    chosen = sbm.add_mutually_exclusive_group()
    chosen.add_argument("--prompts", type=lambda s: s.split(","), help="prompt ids (default: all)")
    chosen.add_argument("--set", dest="sets", action="append", help="the prompts of this set (repeatable)")
    job_options(sbm)
    sbm.add_argument("--wait", action="store_true", help="wait for the job and print its report")

    cnc = command(
        sub,
        "cancel",
        "cancel jobs: a running one stops at its worker's next lease renewal, a queued or finished one is removed",
        commands.cancel,
        ConnectionSettings,
        positional=None,
    )
    cnc.add_argument("job_ids", nargs="+", metavar="JOB", help="job ids (GET /jobs lists them)")

    wat = command(
        sub,
        "watch",
        "submit each checkpoint that finishes writing under DIR",
        commands.watch,
        SubmitSettings,
        positional="dir",
    )
    job_options(wat)
    wat.add_argument("--set", dest="sets", action="append", help="evaluate on the prompts of this set (repeatable)")
    wat.add_argument(
        "--tensorboard",
        type=Path,
        help="write each finished checkpoint's taus here as TensorBoard scalars at its training step, one "
        "run per training run: DIR/<its directory under the watched one>/<family and drafting length> "
        "(needs [tensorboard])",
    )
    wat.add_argument("--interval", type=float, default=10.0, help="seconds between looks (10)")
    wat.add_argument(
        "--once",
        action="store_true",
        help="look twice (to see which files are finished), wait for the jobs submitted, then exit (6 if any failed)",
    )


def _prompts_command(sub: Any) -> None:
    """`prompts add`: dataset files registered as prompt sets (their prompts, or with --whole-chats their
    chats as finished conversations for training)."""
    from eval_worker.prompt_files.register import DEFAULT_MAX_NEW_TOKENS, LossMaskName

    prompts = sub.add_parser("prompts", help="register benchmark prompt sets from dataset files")
    add = command(
        prompts.add_subparsers(dest="prompts_command", required=True),
        "add",
        "register the prompts of dataset files as one set (with --whole-chats: their chats, finished, to train on)",
        commands.prompts_add,
        ConnectionSettings,
        positional=None,
    )
    add.add_argument("files", type=Path, nargs="+", help=".jsonl, .json, .csv, .parquet or save_to_disk dirs")
    add.add_argument("--set", dest="set_name", required=True, help="the set's name (gsm8k, humaneval, ...)")
    add.add_argument(
        "--field",
        help="the prompt's field (default: question, problem, prompt, text, instruction "
        "+ input, turns, conversations / messages)",
    )
    add.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render with the target's chat template (default: when its tokenizer has one)",
    )
    thinking = add.add_mutually_exclusive_group()
    thinking.add_argument(
        "--enable-thinking",
        dest="enable_thinking",
        action="store_true",
        default=None,
        help="passed to the chat template",
    )
    thinking.add_argument("--disable-thinking", dest="enable_thinking", action="store_false")
    add.add_argument(
        "--whole-chats",
        action="store_true",
        help="register each chat row (conversations / messages) whole, as a finished conversation to train on: "
        "trailing non-assistant messages dropped, nothing generated (not with --suffix, --no-chat-template, "
        "--max-new-tokens or the sampling options)",
    )
    add.add_argument(
        "--loss-mask",
        choices=get_args(LossMaskName),
        help="with --whole-chats: the tokens trained on, every assistant turn (assistant_turns, the default) "
        "or the last one (last_turn)",
    )
    add.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="response length (2048)")
    sampling_options(add)
    add.add_argument("--limit", type=int, help="register at most N prompts (after --shuffle-seed)")
    add.add_argument("--shuffle-seed", type=int, help="shuffle the rows with this seed first")
    add.add_argument("--suffix", default="", help="appended to every prompt (e.g. gsm8k's 'Please reason ...')")
    add.add_argument("--skip-bad", action="store_true", help="skip malformed rows (listed) instead of stopping")
    add.add_argument("--wait", action="store_true", help="show the set's progress until every prompt is computed")
    add.add_argument("--dry-run", action="store_true", help="print what registering them would store; register nothing")


def _compare_command(sub: Any) -> None:
    """`compare`: reports side by side by step."""
    cmp_ = command(
        sub, "compare", "table (and plot) of reports by run and step", commands.compare, LookupSettings, positional=None
    )
    cmp_.add_argument("reports", type=Path, nargs="*", help="EvalReport JSON files")
    cmp_.add_argument("--plot", type=Path, help="write a PNG of tau vs step and the acceptance curve (needs [plot])")
    shown = cmp_.add_mutually_exclusive_group()
    shown.add_argument("--wide", action="store_true", help="every column: layers, storage, trees, sets (not 120 wide)")
    shown.add_argument("--json", action="store_true", help="print every report's summaries as JSON instead of a table")


def _export_command(sub: Any) -> None:
    """`export`: a set's hidden states as a peer trainer's offline files."""
    exp = command(
        sub,
        "export",
        "write a prompt set's hidden states as SpecForge's offline training files (.ckpt), resumably",
        _export,
        ConnectionSettings,
        positional=None,
    )
    exp.add_argument("out", type=Path, help="the directory for SpecForge's data.hidden_states_path (a rerun resumes)")
    export_options(exp)


def _export(args: argparse.Namespace, settings: ConnectionSettings) -> int:
    """Export the set into OUT, skipping the files already there, and print what was done."""
    from eval_worker.export import ExportRequest, export

    request = ExportRequest(args.out, args.format, args.set_name, args.layers, args.layer_convention)
    print(f"export: {export(request, settings).line()}")
    return ExitCode.ok


def _check_spec(args: argparse.Namespace) -> None:
    """The options as `EvalSpec` checks them for `POST /jobs` too (ValidationError), before any server is
    asked: `args.family_flags` (each family's block checked), and for `submit` and `watch`, which load
    no checkpoint, the one block the flags mean (`submit`: the checkpoint's family's where it reads here;
    ValueError when it is not clear which)."""
    if not hasattr(args, "mask_token_id"):
        return
    args.family_flags = FamilyFlags.of(args)
    eval_spec(args)
    if args.command == "submit":
        args.family_flags = commands.with_checkpoint_family(args.family_flags, args.checkpoint, args.config)
    if args.command in ("submit", "watch"):
        args.family_flags.block()


def validation_message(e: ValidationError) -> str:
    """A pydantic error as one line: `field: message; ...`."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc']))}: {str(err['msg']).removeprefix('Value error, ')}" for err in e.errors()
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run an `eval-worker` command and return its exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    try:
        _check_spec(args)
        settings = args.build_settings(args)
        if isinstance(settings, EvaluateSettings):  # the commands that walk drafters
            from eval_worker.threads import use_cpu_threads

            use_cpu_threads(settings)
        return int(args.func(args, settings))
    except Exception as e:
        code = _stopped(e, args.command)
        if code is None:
            raise
        return code


def _stopped(e: Exception, command: str) -> int | None:
    """The exit code of an error a command stops with, once its one line is on stderr; None for a bug.
    The error classes are imported here, once one is raised: `--help` and `compare` load no client."""
    from cache_server.client import ApiError, ProtocolError, ServerUnreachable, UnauthorizedError
    from eval_worker.errors import CheckpointRefused, FeatureMismatch
    from eval_worker.parity.engine import EngineNotFit

    if isinstance(e, CheckpointRefused):
        print(f"eval-worker: checkpoint refused: {e}", file=sys.stderr)
        return ExitCode.refused
    if isinstance(e, UnauthorizedError):
        hint = "give eval-worker the server's token (its CACHE_SERVER_TOKEN) as EVAL_WORKER_TOKEN or --token"
        print(f"eval-worker: {e}; {hint}", file=sys.stderr)
        return ExitCode.server
    if isinstance(e, ServerUnreachable | EngineNotFit | ApiError | ProtocolError | FeatureMismatch | TimeoutError):
        print(f"eval-worker: {e}", file=sys.stderr)
        if isinstance(e, ServerUnreachable | EngineNotFit):
            return ExitCode.unreachable if isinstance(e, ServerUnreachable) else ExitCode.engine
        return ExitCode.server
    if isinstance(e, ValueError):  # pydantic's ValidationError too, as one line
        print(f"eval-worker: {validation_message(e) if isinstance(e, ValidationError) else e}", file=sys.stderr)
        return ExitCode.usage
    if isinstance(e, ModuleNotFoundError):  # the light install runs submit, watch and compare only
        extra = {"matplotlib": "plot", "datasets": "prompts", "tensorboard": "tensorboard", "transformers": "mtp"}.get(
            (e.name or "").split(".")[0], "worker"
        )
        print(f"eval-worker {command} needs {e.name}: pip install 'hidden-state-cache[{extra}]'", file=sys.stderr)
        return ExitCode.usage
    return None


if __name__ == "__main__":
    sys.exit(main())
