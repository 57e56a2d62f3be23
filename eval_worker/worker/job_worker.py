"""The job worker behind `eval-worker serve`: claim one job at a time, keep its lease alive while
evaluating, and hand back exactly one outcome (a report, or a failure that says whether to retry)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

from cache_server.client import CacheClient, CacheClientError, JobsClient, LeaseLostError, ServerUnreachable
from eval_worker.errors import CheckpointRefused
from eval_worker.evaluation.evaluate import evaluate_checkpoint
from eval_worker.settings import WorkerSettings
from schemas.jobs import Claim

log = logging.getLogger(__name__)


def default_worker_name() -> str:
    """host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _LeaseKeeper:
    """Renews a lease every lease_s / 3 on a background thread until stopped or lost."""

    def __init__(self, jobs: JobsClient, claim: Claim, lease_s: float) -> None:
        self._jobs, self._claim, self._lease_s = jobs, claim, lease_s
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        job_id = self._claim.job.job_id
        while not self._stop.wait(self._lease_s / 3):
            try:
                self._jobs.renew(job_id, self._claim.lease)
            except LeaseLostError:
                log.warning("lost the lease on job %s; its result will be discarded", job_id)
                self.lost.set()
                return
            except CacheClientError as e:  # transient: the next renewal may get through
                log.warning("renewing job %s failed: %s", job_id, e)


class JobWorker:
    """Claims jobs from one cache server and evaluates them one at a time."""

    def __init__(self, client: CacheClient, settings: WorkerSettings) -> None:
        self.client = client
        self.jobs = JobsClient(client)
        self.settings = settings
        self.name = settings.name or default_worker_name()

    def serve(self, stop: threading.Event) -> None:
        """Claim and run jobs until `stop` is set (checked between jobs)."""
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
        """Claim one job and see it through; False when nothing was claimable."""
        claim = self.jobs.claim(self.name, self.settings.lease_s)
        if claim is None:
            return False
        job = claim.job
        log.info(
            "job %s (attempt %d): %s on %d prompts", job.job_id, job.attempts, job.checkpoint, len(claim.prompt_ids)
        )
        with _LeaseKeeper(self.jobs, claim, self.settings.lease_s) as keeper:
            try:
                report = evaluate_checkpoint(
                    self.client,
                    Path(job.checkpoint),
                    self.settings,
                    prompt_ids=claim.prompt_ids,
                    tree_budgets=job.tree_budgets,
                    layer_ids=job.target_layer_ids,
                    block_size=job.block_size,
                    progress=False,
                )
            except CheckpointRefused as e:
                self._fail(claim, f"checkpoint refused: {e}", retryable=False)
                return True
            except ServerUnreachable:
                raise  # nothing can be reported; the lease expires and the job is retried
            except Exception as e:
                log.exception("job %s failed", job.job_id)
                self._fail(claim, f"{type(e).__name__}: {e}", retryable=True)
                return True
        if keeper.lost.is_set():
            return True
        try:
            self.jobs.complete(job.job_id, claim.lease, report)
            log.info("job %s done: chain tau %s", job.job_id, report.summary.chain.mean_tau)
        except LeaseLostError:
            log.warning("job %s was taken over while running; this result was discarded", job.job_id)
        return True

    def _fail(self, claim: Claim, error: str, *, retryable: bool) -> None:
        log.error("job %s failed (%s): %s", claim.job.job_id, "will retry" if retryable else "final", error)
        try:
            self.jobs.fail(claim.job.job_id, claim.lease, error, retryable)
        except LeaseLostError:
            log.warning("job %s was taken over; its failure was not recorded", claim.job.job_id)
