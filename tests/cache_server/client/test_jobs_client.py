"""`JobsClient`: typed errors and the bearer token (MockTransport), then a job's life on a real server."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from cache_server.client import (
    ApiError,
    CacheClient,
    JobFailedError,
    JobsClient,
    LeaseLostError,
    NotFoundError,
    ReportNotReadyError,
    UnauthorizedError,
)
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobStatus
from schemas.report import EvalReport
from testing.servers import running_server
from tests.cache_server.helpers import error_response
from tests.cache_server.jobs_helpers import checkpoint_tree, report_body


def _jobs(handler, token: str | None = None) -> JobsClient:  # type: ignore[no-untyped-def]
    return JobsClient(CacheClient("http://test", transport=httpx.MockTransport(handler), token=token))


@pytest.mark.parametrize(
    ("response", "exc"),
    [
        (error_response(409, "lease_lost"), LeaseLostError),
        (error_response(409, "job_failed"), JobFailedError),
        (error_response(404, "report_not_ready"), ReportNotReadyError),
        (error_response(401, "unauthorized"), UnauthorizedError),
        (error_response(404, "job_not_found"), NotFoundError),
        (error_response(409, "something_else"), ApiError),
    ],
)
def test_error_codes_become_typed_exceptions(response: httpx.Response, exc: type[Exception]) -> None:
    jobs = _jobs(lambda _: response)
    with pytest.raises(exc) as info:
        jobs.renew("j", "lease")
    assert isinstance(info.value, ApiError) and info.value.code == response.json()["error"]["code"]
    assert issubclass(ReportNotReadyError, NotFoundError)


def test_the_token_is_sent_and_204_means_nothing_to_claim() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(204)

    assert _jobs(handler, token="tok").claim("w", 30) is None
    assert _jobs(handler).claim("w", 30) is None
    assert seen == ["Bearer tok", None]


@pytest.mark.slow
def test_a_job_through_a_real_server(tiny_target: Path, tmp_path: Path) -> None:
    root, _ = checkpoint_tree(tmp_path / "ckpts")
    extra = ("--checkpoint-root", str(root), "--job-max-attempts", "2")
    with (
        running_server(tiny_target, tmp_path / "store", *extra, env={"CACHE_SERVER_TOKEN": "tok"}) as url,
        CacheClient(url, token="tok") as client,
        CacheClient(url) as anonymous,
    ):
        jobs, outsider = JobsClient(client), JobsClient(anonymous)
        [prompt] = client.register([{"token_ids": [4, 5, 6]}])
        with pytest.raises(UnauthorizedError):
            outsider.submit("hf")
        job = jobs.submit(
            "hf", prompts=[prompt.prompt_id], spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[8, 32]))
        )
        assert (job.status, job.max_attempts) == (JobStatus.queued, 2)
        assert [j.job_id for j in outsider.jobs(JobStatus.queued)] == [job.job_id]  # reads are open
        with pytest.raises(ReportNotReadyError):
            outsider.report(job.job_id)

        waited: list[JobStatus] = []
        waiter = threading.Thread(target=lambda: waited.append(outsider.wait(job.job_id, 30, 0.05).status))
        waiter.start()
        claim = jobs.claim("gpu-0", lease_s=30)
        assert claim is not None and claim.prompt_ids == [prompt.prompt_id]
        assert jobs.claim("gpu-1", lease_s=30) is None
        jobs.renew(job.job_id, claim.lease)
        with pytest.raises(LeaseLostError):
            jobs.complete(job.job_id, "stolen", report_body("thief"))
        assert jobs.complete(job.job_id, claim.lease, report_body("gpu-0")).status == JobStatus.done
        waiter.join(timeout=30)
        assert waited == [JobStatus.done]
        assert jobs.report(job.job_id) == EvalReport.model_validate(report_body("gpu-0"))

        refused = jobs.submit(str(root / "runs" / "step100.pt"))
        claim = jobs.claim("gpu-0", lease_s=30)
        assert claim is not None and claim.job.job_id == refused.job_id
        jobs.fail(refused.job_id, claim.lease, "CheckpointRefused: bad fc", retryable=False)
        with pytest.raises(JobFailedError, match="bad fc"):
            jobs.report(refused.job_id)
        assert outsider.wait(refused.job_id, 5, 0.05).status == JobStatus.failed
        jobs.delete(refused.job_id)
        assert [j.job_id for j in jobs.jobs()] == [job.job_id]
