"""The `eval-worker` sub-commands; each takes the parsed arguments and returns an exit code."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from cache_server.client import CacheClient
from cache_server.devices import resolve_device
from cache_server.jobs_client import JobsClient
from eval_worker.settings import WorkerSettings
from schemas.jobs import JobState, JobStatus
from schemas.report import EvalReport

log = logging.getLogger(__name__)
EXIT_JOB_FAILED = 5  # the other exit codes are cli.py's


def _settings(args: argparse.Namespace, *names: str) -> WorkerSettings:
    """Settings from the environment, overridden by the options given on the command line."""
    given: dict[str, Any] = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return WorkerSettings(**given)


def _client(settings: WorkerSettings) -> CacheClient:
    return CacheClient(settings.server, token=settings.token)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set, so that a loop finishes what it is doing, then exits."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def evaluate(args: argparse.Namespace) -> int:
    from eval_worker.report_table import format_report
    from eval_worker.run import run_evaluation

    settings = _settings(args, "server", "device", "dtype")
    with _client(settings) as client:
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


def inspect(args: argparse.Namespace) -> int:
    from eval_worker.inspect import inspect_checkpoint

    print(inspect_checkpoint(args.checkpoint, config_path=args.config, server=args.server))
    return 0


def serve(args: argparse.Namespace) -> int:
    from eval_worker.job_worker import JobWorker

    settings = _settings(args, "server", "device", "poll_interval", "lease_s", "name")
    resolve_device(settings.device)  # a worker that cannot run its jobs must not claim them
    stop = _stop_on_signals()  # finish the job in hand, then exit
    with _client(settings) as client:
        JobWorker(client, settings).serve(stop)
    return 0


def _job_path(checkpoint: Path, root: Path | None) -> str:
    """The path as the server should see it: relative to the shared root, else absolute."""
    real = checkpoint.resolve()
    if root is None:
        return str(real)
    try:
        return str(real.relative_to(root.resolve()))
    except ValueError:
        raise ValueError(f"checkpoint {checkpoint} is not under --checkpoint-root {root}") from None


def _submit(jobs: JobsClient, args: argparse.Namespace, path: str, prompts: Any = "all") -> JobState:
    state = jobs.submit(
        path,
        prompts=prompts,
        tree_budgets=args.tree_budgets,
        target_layer_ids=args.target_layer_ids,
        block_size=args.block_size,
    )
    print(f"job {state.job_id} {state.status.value}: {state.checkpoint_relative}", flush=True)
    return state


def submit(args: argparse.Namespace) -> int:
    from eval_worker.report_table import format_report

    settings = _settings(args, "server", "checkpoint_root")
    with _client(settings) as client:
        jobs = JobsClient(client)
        state = _submit(jobs, args, _job_path(args.checkpoint, settings.checkpoint_root), args.prompts or "all")
        if not args.wait:
            return 0
        # No deadline: every job ends (done, or failed once its attempts are spent) while a worker runs.
        print("waiting for a worker (eval-worker serve) to finish it...", flush=True)
        final = jobs.wait(state.job_id, timeout_s=float("inf"), poll_s=1.0)
        if final.status == JobStatus.failed:
            print(f"job {final.job_id} failed after {final.attempts} attempts: {final.error}")
            return EXIT_JOB_FAILED
        print(format_report(jobs.report(final.job_id)))
    return 0


def watch(args: argparse.Namespace) -> int:
    from eval_worker.watch import CheckpointWatcher

    settings = _settings(args, "server", "checkpoint_root")
    watcher = CheckpointWatcher(args.dir)
    stop = _stop_on_signals()
    with _client(settings) as client:
        jobs = JobsClient(client)
        existing = jobs.jobs()
        # a job's checkpoint as the server resolved it, and as submitted relative to the root
        known = {j.checkpoint for j in existing} | {j.checkpoint_relative for j in existing}
        print(f"watching {args.dir} every {args.interval:.0f} s ({len(existing)} jobs already on the server)")
        looks = 0
        while not stop.is_set():
            for ckpt in watcher.poll():
                path = _job_path(ckpt, settings.checkpoint_root)
                if path in known or str(ckpt.resolve()) in known:
                    log.info("%s already has a job; not submitting it again", ckpt)
                    continue
                known.add(_submit(jobs, args, path).checkpoint)
            looks += 1
            if args.once and looks >= 2:
                break
            stop.wait(args.interval)
    return 0


def compare(args: argparse.Namespace) -> int:
    from eval_worker.compare import compare_table, plot

    reports = [EvalReport.model_validate_json(Path(p).read_text()) for p in args.reports]
    if args.server:
        with CacheClient(args.server) as client:
            jobs = JobsClient(client)
            reports += [jobs.report(j.job_id) for j in jobs.jobs(JobStatus.done)]
    if not reports:
        raise ValueError("no reports to compare: give report files or --server with finished jobs")
    print(compare_table(reports))
    if args.plot:
        plot(reports, args.plot)
        print(f"plot written to {args.plot}")
    return 0


__all__ = ["compare", "evaluate", "inspect", "serve", "submit", "watch"]
