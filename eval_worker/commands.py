"""The `eval-worker` sub-commands: each takes the parsed arguments and its settings, and returns an
exit code. Heavy modules (torch, the evaluator, matplotlib) are imported by the commands that need
them, so that `submit`, `watch` and `compare` run on the light install."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from eval_worker.cli_options import FamilyFlags, eval_spec
from eval_worker.exit_codes import ExitCode

if TYPE_CHECKING:
    from cache_server.client import CacheClient, JobsClient
    from eval_worker.settings import (
        ConnectionSettings,
        EvaluateSettings,
        LookupSettings,
        SubmitSettings,
        WorkerSettings,
    )
    from eval_worker.worker.tensorboard_log import TensorBoardLog
    from schemas.eval_spec import EvalSpec
    from schemas.jobs import JobState

log = logging.getLogger(__name__)


def connect(settings: ConnectionSettings) -> CacheClient:
    """A client of the configured server (and its feature servers)."""
    from cache_server.client import CacheClient

    first, *more = settings.server_urls()
    return CacheClient(first, token=settings.token, feature_servers=more)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set, so that a loop finishes what it is doing, then exits."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def evaluate(args: argparse.Namespace, settings: EvaluateSettings) -> int:
    """Evaluate one checkpoint, or a sweep of several in one pass over the prompts, and print the reports;
    each checkpoint's family options are filled from the flags its family reads."""
    from eval_worker.evaluation.sweep import evaluate_checkpoints, feature_cache, load_checkpoints
    from eval_worker.reports.table import format_report

    checkpoints: list[Path] = args.checkpoints
    outputs = _report_paths(checkpoints, args.out, args.out_dir)
    flags: FamilyFlags = args.family_flags
    spec = eval_spec(args)
    with connect(settings) as client:
        # each checkpoint's family options are the flags its family reads; a flag none reads is refused
        loaded = load_checkpoints(client.model(), checkpoints, spec, flags.blocks())
        flags.check_used({c.family for c in loaded})
        reports = evaluate_checkpoints(
            client,
            loaded,
            settings,
            spec,
            prompt_ids=[args.prompts if args.prompts else None] * len(checkpoints),
            features=feature_cache(settings),
        )
    for report, out in zip(reports, outputs, strict=True):
        print(format_report(report) + "\n")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(report.model_dump_json(indent=1))
            print(f"report written to {out}")
    return ExitCode.ok


def _report_paths(checkpoints: list[Path], out: Path | None, out_dir: Path | None) -> list[Path | None]:
    """Where each report goes: --out FILE for one checkpoint, DIR/<checkpoint name>.json with --out-dir."""
    if out is not None and len(checkpoints) > 1:
        raise ValueError("--out takes one checkpoint; for several, write one report each with --out-dir DIR")
    if out_dir is None:
        return [out] * len(checkpoints)
    paths = [out_dir / f"{c.stem if c.is_file() else c.name}.json" for c in checkpoints]
    if len(set(paths)) != len(paths):
        raise ValueError(f"checkpoints with the same name would share a report in {out_dir}: {sorted(map(str, paths))}")
    return list(paths)


def serve(_: argparse.Namespace, settings: WorkerSettings) -> int:
    """Claim and run jobs until SIGTERM or SIGINT (the job in hand is finished first)."""
    from cache_server.torch_utils import resolve_device
    from eval_worker.worker.job_worker import JobWorker

    resolve_device(settings.device)  # a worker that cannot run its jobs must not claim them
    stop = _stop_on_signals()
    with connect(settings) as client:
        JobWorker(client, settings).serve(stop)
    return ExitCode.ok


def _job_path(path: Path, root: Path | None, what: str = "checkpoint") -> str:
    """The path as the server should see it: relative to the shared root, else absolute."""
    real = path.resolve()
    if root is None:
        return str(real)
    try:
        return str(real.relative_to(root.resolve()))
    except ValueError:
        raise ValueError(f"{what} {path} is not under --checkpoint-root {root}") from None


def _job_spec(args: argparse.Namespace, root: Path | None) -> EvalSpec:
    """The job's spec: the one block the flags mean, and --config as the server should see it."""
    config = _job_path(args.config, root, "config") if args.config is not None else None
    return eval_spec(args, args.family_flags.block(), config)


def with_checkpoint_family(flags: FamilyFlags, path: Path, config: Path | None) -> FamilyFlags:
    """`submit`'s flags, with the checkpoint's family where they fit several and no --family says which,
    read as `evaluate` reads it when this machine can: else as given (their block then asks for --family)."""
    if flags.family is not None or not flags.given or len(flags.fits()) < 2 or not path.exists():
        return flags  # a path that does not exist here is one only the server sees
    try:
        from eval_worker.checkpoints.raw import read_raw
        from eval_worker.families import family_of
    except ModuleNotFoundError:  # the light install reads no checkpoint
        return flags
    return dataclasses.replace(flags, read=family_of(read_raw(path, config).config).name)


def _submit(jobs: JobsClient, spec: EvalSpec, path: str, prompts: Any = "all") -> JobState:
    state = jobs.submit(path, prompts, spec)
    print(f"job {state.job_id} {state.status.value}: {state.checkpoint_relative}", flush=True)
    return state


def submit(args: argparse.Namespace, settings: SubmitSettings) -> int:
    """Queue one checkpoint; with --wait, print its report once a worker has evaluated it."""
    from cache_server.client import JobsClient
    from eval_worker.reports.table import format_report
    from schemas.jobs import JobStatus

    with connect(settings) as client:
        jobs = JobsClient(client)
        spec = _job_spec(args, settings.checkpoint_root)
        state = _submit(jobs, spec, _job_path(args.checkpoint, settings.checkpoint_root), args.prompts or "all")
        if not args.wait:
            return ExitCode.ok
        # No deadline: every job ends (done, or failed once its attempts are spent) while a worker runs.
        print("waiting for a worker (eval-worker serve) to finish it...", flush=True)
        final = jobs.wait(state.job_id, timeout_s=float("inf"), poll_s=1.0)
        if final.status in (JobStatus.failed, JobStatus.cancelled):
            what = "was cancelled" if final.status == JobStatus.cancelled else f"failed after {final.attempts} attempts"
            print(f"job {final.job_id} {what}: {final.error}")
            return ExitCode.job_failed
        print(format_report(jobs.report(final.job_id)))
    return ExitCode.ok


def cancel(args: argparse.Namespace, settings: ConnectionSettings) -> int:
    """Cancel jobs: a running one stops at its worker's next lease renewal, any other is removed."""
    from cache_server.client import JobsClient

    with connect(settings) as client:
        jobs = JobsClient(client)
        for job_id in args.job_ids:
            state = jobs.delete(job_id)
            if state is None:
                print(f"job {job_id}: removed (it was not running)")
            else:
                print(f"job {job_id}: {state.status}; its worker stops at its next lease renewal")
    return ExitCode.ok


def watch(args: argparse.Namespace, settings: SubmitSettings) -> int:
    """Submit each checkpoint under DIR once it has finished writing, each once, and print each of its
    jobs that fails; with --tensorboard, write each finished one's taus there at its training step, one
    TensorBoard run per training run. With --once, wait for the jobs it submitted and exit 6 if any failed."""
    from cache_server.client import JobsClient
    from eval_worker.worker.watch import CheckpointWatcher

    watcher = CheckpointWatcher(args.dir)
    stop = _stop_on_signals()
    board = _tensorboard(args.tensorboard)
    run = Path(_job_path(args.dir, settings.checkpoint_root))  # the run as the server names its checkpoints
    spec = _job_spec(args, settings.checkpoint_root)
    with connect(settings) as client, contextlib.ExitStack() as cleanup:
        if board is not None:
            cleanup.callback(board.close)
        jobs = JobsClient(client)
        existing = jobs.jobs()
        # a job's checkpoint as the server resolved it, and as submitted relative to the root
        known = {j.checkpoint for j in existing} | {j.checkpoint_relative for j in existing}
        print(f"watching {args.dir} every {args.interval:.0f} s ({len(existing)} jobs already on the server)")
        submitted: dict[str, JobState | None] = {}  # this watch's jobs -> its failure, once printed
        looks = 0
        while not stop.is_set():
            for ckpt in watcher.poll():
                path = _job_path(ckpt, settings.checkpoint_root)
                if path in known or str(ckpt.resolve()) in known:
                    log.info("%s already has a job; not submitting it again", ckpt)
                    continue
                state = _submit(jobs, spec, path)
                known.add(state.checkpoint)
                submitted[state.job_id] = None
            looks += 1
            last = args.once and looks >= 2
            _print_failures(jobs, submitted, wait=last)
            if board is not None:
                relative = settings.checkpoint_root is not None
                _write_finished(jobs, board, run, relative, wait=last)
            if last:
                break
            stop.wait(args.interval)
    failed = [j for j in submitted.values() if j is not None]
    if failed:
        print(f"{len(failed)} of the {len(submitted)} jobs submitted failed", file=sys.stderr)
    return ExitCode.job_failed if failed else ExitCode.ok


def _print_failures(jobs: JobsClient, submitted: dict[str, JobState | None], *, wait: bool) -> None:
    """Print each of `submitted` that failed, once (kept in `submitted`); with `wait`, wait for all to end."""
    from schemas.jobs import JobStatus

    open_ids = [i for i, failure in submitted.items() if failure is None]
    if not open_ids:
        return
    if wait:  # `--once`: every job it submitted has ended before it exits
        states = [jobs.wait(i, timeout_s=float("inf"), poll_s=1.0) for i in open_ids]
    else:
        states = [j for j in jobs.jobs(JobStatus.failed) if j.job_id in set(open_ids)]
    for job in states:
        if job.status == JobStatus.failed:
            submitted[job.job_id] = job
            print(
                f"job {job.job_id} failed after {job.attempts} attempts ({job.checkpoint_relative}): {job.error}",
                file=sys.stderr,
                flush=True,
            )


def _tensorboard(log_dir: Path | None) -> TensorBoardLog | None:
    if log_dir is None:
        return None
    from eval_worker.worker.tensorboard_log import TensorBoardLog

    return TensorBoardLog(log_dir)


def _write_finished(jobs: JobsClient, board: TensorBoardLog, run: Path, relative: bool, *, wait: bool) -> None:
    """Write the run's done jobs not yet in the log, each in its training run's TensorBoard run (its
    directory relative to the watched one); with `wait`, first wait for the run's jobs to end."""
    from schemas.jobs import JobStatus

    mine = [j for j in jobs.jobs() if Path(j.checkpoint_relative if relative else j.checkpoint).is_relative_to(run)]
    if wait:  # `--once`: what was submitted is written before exiting
        mine = [jobs.wait(j.job_id, timeout_s=float("inf"), poll_s=1.0) for j in mine if not board.has(j.job_id)]
    for job in mine:
        if job.status == JobStatus.done and not board.has(job.job_id):
            report = jobs.report(job.job_id)
            path = Path(job.checkpoint_relative if relative else job.checkpoint)
            written = board.write(job.job_id, report, PurePosixPath(path.parent.relative_to(run).as_posix()))
            if written is not None:
                print(f"tensorboard: {job.checkpoint_relative} at step {report.step} in run {written}", flush=True)


def compare(args: argparse.Namespace, settings: LookupSettings) -> int:
    """Print reports side by side by run and step (--wide: every column; --json: every number); with
    --plot, draw tau vs step and the acceptance curve."""
    from eval_worker.reports.compare import compare_json, compare_table
    from schemas.jobs import JobStatus
    from schemas.report import EvalReport

    reports = [EvalReport.model_validate_json(Path(p).read_text()) for p in args.reports]
    if settings.server:
        from cache_server.client import JobsClient  # report files alone need no client

        with connect(settings) as client:
            jobs = JobsClient(client)
            reports += [jobs.report(j.job_id) for j in jobs.jobs(JobStatus.done)]
    if not reports:
        raise ValueError("no reports to compare: give report files or --server with finished jobs")
    print(compare_json(reports) if args.json else compare_table(reports, wide=args.wide))
    if args.plot:
        from eval_worker.reports.plot import plot

        plot(reports, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return ExitCode.ok


def prompts_add(args: argparse.Namespace, settings: ConnectionSettings) -> int:
    """Register dataset files' prompts as one set; with --wait, show its progress until computed."""
    from eval_worker.prompt_files.register import AddOptions, add_prompts, plan_prompts, wait_with_progress
    from schemas.prompts import GenerateSpec

    generate = GenerateSpec(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        samples=args.samples,
    )
    opts = AddOptions(
        set_name=args.set_name,
        field=args.field,
        chat_template=args.chat_template,
        enable_thinking=args.enable_thinking,
        limit=args.limit,
        shuffle_seed=args.shuffle_seed,
        suffix=args.suffix,
        skip_bad=args.skip_bad,
        whole_chats=args.whole_chats,
        loss_mask=args.loss_mask,
        timeout_s=settings.timeout_s,
        generate=generate,
    )
    with connect(settings) as client:
        if args.dry_run:
            plan, later_turns = plan_prompts(client, args.files, opts)
            print("\n".join(plan.lines()))
            if later_turns:
                print(
                    f"not counted: {later_turns} later turns of multi-turn rows "
                    "(tokenized once the earlier turns are answered)"
                )
            return ExitCode.ok
        added = add_prompts(client, args.files, opts)
        for message in added.skipped:
            print(f"skipped: {message}")
        print(added.line(args.set_name, 1 if args.whole_chats else args.samples), flush=True)
        if args.wait:
            wait_with_progress(client, args.set_name, settings.timeout_s)
    return ExitCode.ok
