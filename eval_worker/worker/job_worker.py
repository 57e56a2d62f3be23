"""The job worker behind `eval-worker serve`: claim one job at a time, keep its lease alive while
evaluating, and hand back exactly one outcome (a report, or a failure that says whether to retry).
Each renewal carries the walk's progress (and logs it); one that answers `cancelling` stops the job's
walk at its next drafter forward, and the job is handed back as stopped (the server ends it cancelled)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from cache_server.client import CacheClient, CacheClientError, JobsClient, LeaseLostError, ServerUnreachable
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.checkpoints.loading import load_with_spec
from eval_worker.errors import CheckpointRefused, NothingToWalk, WalkStopped
from eval_worker.evaluation.progress import WalkProgress, WalkSoFar
from eval_worker.evaluation.sweep import evaluate_checkpoints, feature_cache
from eval_worker.reports.conventions import chain_line
from eval_worker.settings import WorkerSettings
from schemas.eval_spec import EvalSpec
from schemas.jobs import Claim, JobProgress, JobStatus
from schemas.report import EvalReport
from schemas.sampling import DraftSampling

log = logging.getLogger(__name__)


def default_worker_name() -> str:
    """host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Walks:
    """Where each claimed job's walk is now (the `WalkProgress` of the evaluation it is in, and its
    index there), so that its lease keeper can report it and stop it; and the jobs cancelled."""

    def __init__(self) -> None:
        self._at: dict[str, tuple[WalkProgress, int]] = {}
        self.cancelled: set[str] = set()
        self.stopped: set[str] = set()  # cancelled jobs whose walk ended early
        self.failed: set[str] = set()  # jobs whose failure is recorded already: nothing more to report

    def begin(self, walk: WalkProgress, job_ids: Sequence[str]) -> None:
        """An evaluation of these jobs (checkpoint i: `job_ids[i]`) counts into `walk`."""
        for i, job_id in enumerate(job_ids):
            self._at[job_id] = (walk, i)
            if job_id in self.cancelled:
                walk.stop(i)

    def so_far(self, job_id: str) -> WalkSoFar | None:
        """The job's walk so far; None before it began."""
        walk, i = self._at.get(job_id, (None, 0))
        return walk.of(i) if walk is not None and walk.started else None

    def cancel(self, job_id: str) -> None:
        """Stop the job's walk at its next drafter forward (or as soon as one begins)."""
        self.cancelled.add(job_id)
        walk, i = self._at.get(job_id, (None, 0))
        if walk is not None:
            walk.stop(i)


def _job_progress(so_far: WalkSoFar) -> JobProgress:
    return JobProgress(
        prompts_walked=so_far.prompts_walked,
        prompts_total=so_far.prompts_total,
        rounds=so_far.rounds,
        elapsed_s=so_far.elapsed_s,
        eta_s=so_far.eta_s,
    )


class _LeaseKeeper:
    """Renews a lease every lease_s / 3 on a background thread until stopped or lost, each renewal
    reporting the job's walk so far (and logging it); a renewal that answers `cancelling` cancels the
    job's walk. A last report follows the walk's end."""

    def __init__(self, jobs: JobsClient, claim: Claim, lease_s: float, walks: _Walks) -> None:
        self._jobs, self._claim, self._lease_s, self._walks = jobs, claim, lease_s, walks
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        if not self.lost.is_set() and self._claim.job.job_id not in self._walks.failed:
            self._renew()  # the final count, shown beside the job's outcome

    def _run(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """One renewal with the walk so far; False once the lease is lost."""
        job_id = self._claim.job.job_id
        so_far = self._walks.so_far(job_id)
        try:
            state = self._jobs.renew(job_id, self._claim.lease, progress=_job_progress(so_far) if so_far else None)
        except LeaseLostError:
            log.warning("lost the lease on job %s; its result will be discarded", job_id)
            self.lost.set()
            return False
        except CacheClientError as e:  # transient: the next renewal may get through
            log.warning("renewing job %s failed: %s", job_id, e)
            return True
        if so_far is not None:
            log.info("job %s: %s", job_id, so_far.line())
        if state.status == JobStatus.cancelling and job_id not in self._walks.cancelled:
            log.info("job %s was cancelled; stopping its walk", job_id)
            self._walks.cancel(job_id)
        return True


class JobWorker:
    """Claims jobs from one cache server and evaluates them, up to `max_batch_jobs` in one pass over
    the prompts; fetched features stay resident across jobs (`feature_cache_gb`)."""

    def __init__(
        self, client: CacheClient, settings: WorkerSettings, *, progress: Callable[[], WalkProgress] = WalkProgress
    ) -> None:
        self.client = client
        self.jobs = JobsClient(client)
        self.settings = settings
        self.name = settings.name or default_worker_name()
        self.features = feature_cache(settings)
        self._progress = progress  # a new WalkProgress for each evaluation
        self._walks = _Walks()

    def serve(self, stop: threading.Event) -> None:
        """Claim and run jobs until `stop` is set (checked between batches)."""
        log.info("worker %s polling %s every %.1f s", self.name, self.client.base_url, self.settings.poll_interval)
        while not stop.is_set():
            try:
                worked = self.run_one()
            except ServerUnreachable as e:
                log.warning("%s; retrying in %.1f s", e, self.settings.poll_interval)
                worked = False
            if not worked:
                stop.wait(self.settings.poll_interval)

    def run_one(self) -> bool:
        """Claim up to `max_batch_jobs` jobs and see each through to one outcome; False when none was
        claimable. Each job keeps its own lease alive and gets its own report or failure."""
        claims: list[Claim] = []
        while len(claims) < self.settings.max_batch_jobs:
            claim = self.jobs.claim(self.name, self.settings.lease_s)
            if claim is None:
                break
            job = claim.job
            log.info(
                "job %s (attempt %d): %s on %d prompts", job.job_id, job.attempts, job.checkpoint, len(claim.prompt_ids)
            )
            claims.append(claim)
        if not claims:
            return False
        self._walks = _Walks()
        with ExitStack() as stack:
            keepers = [
                stack.enter_context(_LeaseKeeper(self.jobs, c, self.settings.lease_s, self._walks)) for c in claims
            ]
            outcomes = self._evaluate(claims)
        for claim, keeper, report in zip(claims, keepers, outcomes, strict=True):
            if keeper.lost.is_set():
                continue
            if claim.job.job_id in self._walks.stopped:
                self._stopped(claim)
            if report is None:
                continue
            try:
                self.jobs.complete(claim.job.job_id, claim.lease, report)
                log.info("job %s done: chain tau %s", claim.job.job_id, chain_line(report.summary))
            except LeaseLostError:
                log.warning("job %s was taken over while running; this result was discarded", claim.job.job_id)
        return True

    def _evaluate(self, claims: list[Claim]) -> list[EvalReport | None]:
        """Each job's report, or None once its failure is recorded. Each checkpoint is loaded as its job's
        spec says and carries its own options, so jobs drafting alike (greedily, or probabilistically)
        are evaluated together whatever else they ask; if that fails, one by one, so that each failure
        lands on its job."""
        info = self.client.model()
        loaded: dict[int, LoadedCheckpoint] = {}
        for i, claim in enumerate(claims):
            job = claim.job
            try:
                loaded[i] = load_with_spec(Path(job.checkpoint), info, job.spec)
            except CheckpointRefused as e:
                self._fail(claim, f"checkpoint refused: {e}", retryable=False)
        reports: list[EvalReport | None] = [None] * len(claims)
        by_drafting: dict[DraftSampling, list[int]] = {}
        for i in loaded:
            by_drafting.setdefault(claims[i].job.spec.draft_sampling, []).append(i)
        for drafting, batch in by_drafting.items():
            done = self._batch(batch, loaded, claims, drafting)
            if done is None:  # the batch failed or a job was cancelled: one by one, each outcome on its job
                log.warning("a batch of %d jobs failed or was cut short; evaluating them one by one", len(batch))
                done = {}
                for i in batch:
                    if claims[i].job.job_id not in self._walks.stopped:
                        done |= self._batch([i], loaded, claims, drafting) or {}
            for i, report in done.items():
                reports[i] = report
        return reports

    def _batch(
        self, batch: list[int], loaded: dict[int, LoadedCheckpoint], claims: list[Claim], drafting: DraftSampling
    ) -> dict[int, EvalReport] | None:
        """Reports of the jobs `batch` evaluated together; None if that failed or a cancelled job's walk
        stopped it (a single job's failure is recorded on it; a stopped one is in `_walks.stopped`)."""
        walk = self._progress()
        job_ids = [claims[i].job.job_id for i in batch]
        self._walks.begin(walk, job_ids)
        try:
            reports = evaluate_checkpoints(
                self.client,
                [loaded[i] for i in batch],
                self.settings,
                EvalSpec(draft_sampling=drafting),
                prompt_ids=[claims[i].prompt_ids for i in batch],
                set_members_of=[claims[i].set_members for i in batch],
                progress=False,
                features=self.features,
                walk=walk,
            )
        except ServerUnreachable:
            raise  # nothing can be reported; the leases expire and the jobs are retried
        except WalkStopped:
            self._walks.stopped |= self._walks.cancelled & set(job_ids)
            return None if len(batch) > 1 else {}
        except Exception as e:
            if len(batch) > 1:
                return None
            claim = claims[batch[0]]
            if isinstance(e, CheckpointRefused):
                self._fail(claim, f"checkpoint refused: {e}", retryable=False)
            elif isinstance(e, NothingToWalk):  # the prompts stay as they are: a retry finds the same
                self._fail(claim, str(e), retryable=False)
            else:
                log.exception("job %s failed", claim.job.job_id)
                self._fail(claim, f"{type(e).__name__}: {e}", retryable=True)
            return {}
        return dict(zip(batch, reports, strict=True))

    def _stopped(self, claim: Claim) -> None:
        """Hand back a cancelled job whose walk was stopped: the server ends it cancelled."""
        so_far = self._walks.so_far(claim.job.job_id)
        walked = f" after {so_far.prompts_walked} of {so_far.prompts_total} prompts" if so_far else ""
        log.info("job %s cancelled: its walk stopped%s", claim.job.job_id, walked)
        try:
            self.jobs.fail(claim.job.job_id, claim.lease, f"the worker stopped its walk{walked}", False)
        except LeaseLostError:
            log.warning("job %s was taken over; its cancellation was not recorded", claim.job.job_id)

    def _fail(self, claim: Claim, error: str, *, retryable: bool) -> None:
        log.error("job %s failed (%s): %s", claim.job.job_id, "will retry" if retryable else "final", error)
        self._walks.failed.add(claim.job.job_id)
        try:
            self.jobs.fail(claim.job.job_id, claim.lease, error, retryable)
        except LeaseLostError:
            log.warning("job %s was taken over; its failure was not recorded", claim.job.job_id)
