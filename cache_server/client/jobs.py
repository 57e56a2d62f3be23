"""`JobsClient`: submit and watch checkpoint-evaluation jobs, and the worker protocol (claim, renew,
complete, fail). Errors are the client's (`errors.py`): e.g. `LeaseLostError` means drop the work."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from cache_server.client.cache import CacheClient
from cache_server.client.errors import ProtocolError
from schemas.eval_spec import EvalSpec
from schemas.jobs import (
    FINISHED,
    Claim,
    ClaimRequest,
    CompleteRequest,
    FailRequest,
    JobProgress,
    JobState,
    JobStatus,
    JobSubmit,
    RenewRequest,
)
from schemas.report import EvalReport


class JobsClient:
    """Wraps a `CacheClient` (which carries the base URL, the token and the connection pool)."""

    def __init__(self, client: CacheClient) -> None:
        self.client = client

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, path, **kwargs)

    def _state(self, method: str, path: str, **kwargs: Any) -> JobState:
        return JobState.model_validate(self._call(method, path, **kwargs).json())

    # -- submitting and watching ----------------------------------------------------------------

    def submit(
        self, checkpoint: str, prompts: Literal["all"] | Sequence[str] = "all", spec: EvalSpec | None = None
    ) -> JobState:
        """Queue an evaluation of `checkpoint` (a path under the server's --checkpoint-root) on `prompts`,
        measuring what `spec` asks (default: the chain, greedy drafting, the checkpoint's own options)."""
        body = JobSubmit.model_validate(
            {
                **(spec or EvalSpec()).model_dump(),
                "checkpoint": checkpoint,
                "prompts": prompts if prompts == "all" else list(prompts),
            }
        )
        return self._state("POST", "/jobs", json=body.model_dump(mode="json", exclude_none=True))

    def job(self, job_id: str) -> JobState:
        """One job's state."""
        return self._state("GET", f"/jobs/{job_id}")

    def jobs(self, status: JobStatus | None = None) -> list[JobState]:
        """Every job (in submission order), paging through `GET /jobs`."""
        items = self.client.paged("/jobs", "jobs", status.value if status else None)
        return [JobState.model_validate(j) for j in items]

    def delete(self, job_id: str) -> JobState | None:
        """Remove a job that is not running, with its report (None); cancel a running one: its state,
        cancelling until its worker stops, then cancelled."""
        response = self._call("DELETE", f"/jobs/{job_id}")
        return JobState.model_validate(response.json()) if response.status_code == 202 else None

    def report(self, job_id: str) -> EvalReport:
        """The report of a done job; ReportNotReadyError before, JobFailedError if it failed."""
        text = self._call("GET", f"/jobs/{job_id}/report").text
        try:
            return EvalReport.model_validate_json(text)
        except ValidationError as e:
            raise ProtocolError(f"job {job_id}'s report is not an EvalReport: {e}") from e

    def wait(self, job_id: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> JobState:
        """Poll until the job is done, failed or cancelled (check `.status`); TimeoutError past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.job(job_id)
            if state.status in FINISHED:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state.status} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    # -- worker protocol ------------------------------------------------------------------------

    def claim(self, worker: str, lease_s: float) -> Claim | None:
        """The next job leased to `worker`, or None when nothing is claimable."""
        body = ClaimRequest(worker=worker, lease_s=lease_s).model_dump(mode="json")
        response = self._call("POST", "/jobs/claim", json=body)
        if response.status_code == 204:
            return None
        return Claim.model_validate(response.json())

    def renew(
        self, job_id: str, lease: str, lease_s: float | None = None, progress: JobProgress | None = None
    ) -> JobState:
        """Extend the lease from now, reporting `progress` when given; LeaseLostError once the job is no
        longer this lease's. The state's status is `cancelling` once the job's cancel was asked: stop."""
        body = RenewRequest(lease=lease, lease_s=lease_s, progress=progress).model_dump(mode="json", exclude_none=True)
        return self._state("POST", f"/jobs/{job_id}/renew", json=body)

    def complete(self, job_id: str, lease: str, report: EvalReport | dict[str, Any]) -> JobState:
        """Hand in the job's one report."""
        checked = report if isinstance(report, EvalReport) else EvalReport.model_validate(report)
        body = CompleteRequest(lease=lease, report=checked).model_dump(mode="json")
        return self._state("POST", f"/jobs/{job_id}/complete", json=body)

    def fail(self, job_id: str, lease: str, error: str, retryable: bool) -> JobState:
        """Report a failure; `retryable` puts the job back in the queue while attempts remain."""
        body = FailRequest(lease=lease, error=error, retryable=retryable).model_dump(mode="json")
        return self._state("POST", f"/jobs/{job_id}/fail", json=body)
