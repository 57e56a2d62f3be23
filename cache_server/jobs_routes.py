"""HTTP routes of checkpoint evaluation jobs and of the worker protocol: parse, call, return."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from cache_server.auth import WriteAccess
from cache_server.job_intake import check_submission
from cache_server.jobs import JobStore
from cache_server.routes import ServiceDep
from schemas.jobs import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    FailRequest,
    JobPage,
    JobState,
    JobStatus,
    JobSubmit,
    RenewRequest,
)


def get_jobs(request: Request) -> JobStore:
    return request.app.state.jobs


def get_checkpoint_root(request: Request) -> Path | None:
    return request.app.state.checkpoint_root


JobsDep = Annotated[JobStore, Depends(get_jobs)]
RootDep = Annotated[Path | None, Depends(get_checkpoint_root)]
jobs_router = APIRouter(prefix="/jobs")


@jobs_router.post("", status_code=202, dependencies=[WriteAccess])
def submit(body: JobSubmit, jobs: JobsDep, service: ServiceDep, root: RootDep) -> JobState:
    info = service.target.info
    checked = check_submission(
        body,
        root=root,
        is_registered=lambda p: service.registry.get(p) is not None,
        num_layers=info.num_layers,
    )
    return jobs.submit(
        checked.spec, checkpoint_relative=checked.checkpoint_relative, target_fingerprint=info.fingerprint
    )


@jobs_router.get("")
def list_jobs(
    jobs: JobsDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    status: JobStatus | None = None,
) -> JobPage:
    return jobs.page(offset, limit, status)


@jobs_router.post(
    "/claim",
    dependencies=[WriteAccess],
    response_model=Claim,
    responses={204: {"description": "nothing is claimable"}},
)
def claim(body: ClaimRequest, jobs: JobsDep, service: ServiceDep) -> Claim | Response:
    leased = jobs.claim(body.worker, body.lease_s)
    if leased is None:
        return Response(status_code=204)
    job = leased.job
    ids = job.prompts if isinstance(job.prompts, list) else service.evaluable_prompt_ids()
    return Claim(job=job, lease=leased.lease, prompt_ids=ids)


@jobs_router.get("/{job_id}")
def job_state(job_id: str, jobs: JobsDep) -> JobState:
    return jobs.get(job_id)


@jobs_router.delete("/{job_id}", status_code=204, dependencies=[WriteAccess])
def delete(job_id: str, jobs: JobsDep) -> Response:
    jobs.delete(job_id)
    return Response(status_code=204)


@jobs_router.get("/{job_id}/report")
def report(job_id: str, jobs: JobsDep) -> Response:
    return Response(content=jobs.report(job_id), media_type="application/json")


@jobs_router.post("/{job_id}/renew", dependencies=[WriteAccess])
def renew(job_id: str, body: RenewRequest, jobs: JobsDep) -> JobState:
    return jobs.renew(job_id, body.lease, body.lease_s)


@jobs_router.post("/{job_id}/complete", dependencies=[WriteAccess])
def complete(job_id: str, body: CompleteRequest, jobs: JobsDep) -> JobState:
    return jobs.complete(job_id, body.lease, body.report.model_dump_json())


@jobs_router.post("/{job_id}/fail", dependencies=[WriteAccess])
def fail(job_id: str, body: FailRequest, jobs: JobsDep) -> JobState:
    return jobs.fail(job_id, body.lease, body.error, retryable=body.retryable)
