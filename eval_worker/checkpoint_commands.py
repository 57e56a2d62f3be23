"""The `eval-worker` sub-commands that look at one checkpoint against a server: `inspect`, `parity`
(against a serving engine) and `doctor` (against the usual wrong readings of its layers)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from eval_worker.cli_options import eval_spec
from eval_worker.commands import connect
from eval_worker.exit_codes import ExitCode

if TYPE_CHECKING:
    from eval_worker.settings import EvaluateSettings, LookupSettings
    from schemas.eval_spec import EvalSpec


def _spec(args: argparse.Namespace) -> EvalSpec:
    """What loading the checkpoint reads: --config, --inert-config-keys, and the family options given
    (--mask-token-id: DFlash's), refused when loading finds another family."""
    return eval_spec(args, args.family_flags.block())


def parity(args: argparse.Namespace, settings: EvaluateSettings) -> int:
    """Each prompt alone on the engine beside its offline chain rounds (at T > 0: its sampled outputs,
    after the probe); 0 when every prompt agrees, 7 with one line when the engine is not lossless."""
    from eval_worker.parity.engine import VllmEngine
    from eval_worker.parity.options import sampling_of
    from eval_worker.parity.probe import ProbeOptions
    from eval_worker.parity.report import RunSetting
    from eval_worker.parity.run import run_parity
    from eval_worker.parity.table import format_parity

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    setting = RunSetting(sampling_of(args), args.samples, args.draft_sampling)
    probe = ProbeOptions(temperature=args.probe_temperature, prompts=args.probe_prompts)
    with contextlib.closing(VllmEngine(args.engine)) as engine, connect(settings) as client:
        report = run_parity(
            client,
            args.checkpoint,
            engine,
            settings,
            spec=_spec(args),
            sets=args.sets or (),
            limit=args.limit,
            setting=setting,
            probe=probe,
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report.model_dump_json(indent=1))
    if report.probe is not None and report.probe.lossless is False:
        print(f"eval-worker: {report.probe.reason}", file=sys.stderr)
        return ExitCode.not_lossless
    print(format_parity(report))
    return ExitCode.ok if report.agrees else ExitCode.disagrees


def doctor(args: argparse.Namespace, settings: EvaluateSettings) -> int:
    """Chain tau of the declared layers and of the shifted readings, with a plain verdict."""
    from eval_worker.evaluation.doctor import doctor as run_doctor
    from eval_worker.evaluation.doctor import format_doctor

    if args.limit < 1:
        raise ValueError(f"--limit must be at least 1, got {args.limit}")
    with connect(settings) as client:
        readings = run_doctor(
            client,
            args.checkpoint,
            settings,
            limit=args.limit,
            spec=_spec(args),
        )
    print(format_doctor(args.checkpoint, readings))
    return ExitCode.ok


def inspect(args: argparse.Namespace, settings: LookupSettings) -> int:
    """Describe a checkpoint, and with a server check it against the server's target."""
    from eval_worker.checkpoints.info import describe_checkpoint

    client = connect(settings) if settings.server else None
    try:
        print(describe_checkpoint(args.checkpoint, _spec(args), client=client))
    finally:
        if client is not None:
            client.close()
    return ExitCode.ok
