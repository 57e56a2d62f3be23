"""HTTP routes of checkpoint-evaluation jobs and of the worker protocol: parse, call, return."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Response

from cache_server.api.auth import WriteAccess
from cache_server.api.deps import JobsDep, RootDep, ServiceDep
from cache_server.api.error_handlers import error_responses
from cache_server.jobs.intake import check_submission
from schemas.errors import ErrorCode as E
from schemas.jobs import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    FailRequest,
    JobPage,
    JobReport,
    JobReportPage,
    JobState,
    JobStatus,
    JobSubmit,
    RenewRequest,
)
from schemas.layers import MAX_OFFSET, AsciiInt
from schemas.report import EvalReport

jobs_router = APIRouter(prefix="/jobs", tags=["jobs"])
_LEASED = (E.unauthorized, E.job_not_found, E.lease_lost)


@jobs_router.post(
    "",
    status_code=202,
    dependencies=[WriteAccess],
    responses=error_responses(
        E.unauthorized, E.jobs_disabled, E.invalid_checkpoint_path, E.unknown_prompts, E.unknown_sets, E.invalid_layers
    ),
)
def submit(body: JobSubmit, jobs: JobsDep, service: ServiceDep, root: RootDep) -> JobState:
    """Queue an evaluation of a checkpoint under the server's --checkpoint-root (checked before queueing)."""
    info = service.model_info()
    checked = check_submission(
        body,
        root=root,
        is_registered=service.is_registered,
        num_layers=info.num_layers,
        set_names=service.sets.names(),
        settings_of=lambda spec: service.prompts.settings(spec.prompts, spec.sets),
    )
    return jobs.submit(
        checked.spec, checkpoint_relative=checked.checkpoint_relative, target_fingerprint=info.fingerprint
    )


@jobs_router.get("", responses=error_responses())
def list_jobs(
    jobs: JobsDep,
    offset: Annotated[AsciiInt, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[AsciiInt, Query(ge=1, le=1000)] = 100,
    status: JobStatus | None = None,
) -> JobPage:
    """One page of the jobs in submission order, optionally of one status."""
    return jobs.page(offset, limit, status)


@jobs_router.post(
    "/claim",
    dependencies=[WriteAccess],
    response_model=Claim,
    responses={204: {"description": "nothing is claimable"}, **error_responses(E.unauthorized)},
)
def claim(body: ClaimRequest, jobs: JobsDep, service: ServiceDep) -> Claim | Response:
    """Lease the oldest claimable job to a worker, with the prompt ids it must evaluate (204: none)."""
    leased = jobs.claim(body.worker, body.lease_s)
    if leased is None:
        return Response(status_code=204)
    job = leased.job
    ids = job.prompts if isinstance(job.prompts, list) else service.prompts.evaluable_prompt_ids(job.sets)
    members = {name: service.sets.members(name) or [] for name in job.sets}
    return Claim(job=job, lease=leased.lease, prompt_ids=ids, set_members=members)


@jobs_router.get("/reports", responses=error_responses())
def reports(
    jobs: JobsDep,
    offset: Annotated[AsciiInt, Query(ge=0, le=MAX_OFFSET)] = 0,
    limit: Annotated[AsciiInt, Query(ge=1, le=1000)] = 100,
) -> JobReportPage:
    """Done jobs' report summaries in one call (each report without its per-prompt rounds), for the
    leaderboard page and dashboards."""
    done, total = jobs.done_reports(offset, limit)
    out = [
        JobReport(job_id=job.job_id, checkpoint_relative=job.checkpoint_relative, finished_at=job.finished_at,
                  report=EvalReport.model_validate({**json.loads(text), "prompts": []}))  # rounds not validated
        for job, text in done
    ]  # fmt: skip
    return JobReportPage(reports=out, total=total, offset=offset, limit=limit)


@jobs_router.get("/{job_id}", responses=error_responses(E.job_not_found))
def job_state(job_id: str, jobs: JobsDep) -> JobState:
    """One job's status, attempts, worker, times and latest error."""
    return jobs.get(job_id)


@jobs_router.delete(
    "/{job_id}",
    status_code=204,
    dependencies=[WriteAccess],
    response_model=None,
    responses={
        202: {"model": JobState, "description": "the job was running: it is cancelling until its worker stops"},
        **error_responses(E.unauthorized, E.job_not_found),
    },
)
def delete(job_id: str, jobs: JobsDep) -> Response:
    """Remove a job that is not running, with its report (204); cancel a running one (202: its state,
    cancelling, then cancelled once its worker has stopped, at its next lease renewal)."""
    cancelling = jobs.delete(job_id)
    if cancelling is None:
        return Response(status_code=204)
    return Response(content=cancelling.model_dump_json(), status_code=202, media_type="application/json")


@jobs_router.get(
    "/{job_id}/report",
    response_model=EvalReport,
    responses=error_responses(E.job_not_found, E.report_not_ready, E.job_failed),
)
def report(job_id: str, jobs: JobsDep) -> Response:
    """The job's `EvalReport` once it is done."""
    return Response(content=jobs.report(job_id), media_type="application/json")


@jobs_router.post("/{job_id}/renew", dependencies=[WriteAccess], responses=error_responses(*_LEASED))
def renew(job_id: str, body: RenewRequest, jobs: JobsDep) -> JobState:
    """Extend a running job's lease from now (by the claim's lease_s unless given), storing the walk's
    progress when sent; the state answered says `cancelling` once the job's cancel was asked."""
    return jobs.renew(job_id, body.lease, body.lease_s, body.progress)


@jobs_router.post("/{job_id}/complete", dependencies=[WriteAccess], responses=error_responses(*_LEASED))
def complete(job_id: str, body: CompleteRequest, jobs: JobsDep) -> JobState:
    """Store the job's one report and mark it done; a lost lease's report is dropped (409)."""
    return jobs.complete(job_id, body.lease, body.report.model_dump_json(exclude_unset=True))  # as sent


@jobs_router.post("/{job_id}/fail", dependencies=[WriteAccess], responses=error_responses(*_LEASED))
def fail(job_id: str, body: FailRequest, jobs: JobsDep) -> JobState:
    """Record a failure: retried while attempts remain if retryable, else failed at once."""
    return jobs.fail(job_id, body.lease, body.error, retryable=body.retryable)
