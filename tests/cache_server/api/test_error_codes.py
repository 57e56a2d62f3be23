"""Every error code, end to end: the server sends it with its status over real HTTP, and the client
raises the class its one table names. The target is real; a wrapper makes chosen prompts fail or
wait, which is the only way to reach `prompt_failed`, `prompt_not_ready` and `internal_error`."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from cache_server.api.app import build_service, create_app
from cache_server.client import (
    ApiError,
    BadRequestError,
    CacheClient,
    InvalidRequestError,
    JobFailedError,
    JobsClient,
    JobsDisabledError,
    LeaseLostError,
    NotFoundError,
    NotReadyError,
    PromptFailedError,
    ReportNotReadyError,
    ServerError,
    UnauthorizedError,
)
from cache_server.client.errors import error_class
from cache_server.compute.service import HiddenStateService
from cache_server.settings import ServeSettings
from schemas.errors import STATUS, ErrorCode
from testing.servers import serving_app
from tests.cache_server.helpers import serve_settings

TOKEN = "s3cret"
FAILS, WAITS = 13, 14  # prompts starting with these token ids fail in the target / wait for a gate


class _Rigged:
    """The real service, with a target that fails or waits on chosen prompts and has no heads."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, settings: ServeSettings) -> HiddenStateService:
        service = build_service(settings)
        capture, gate = service.target.capturer.capture, self.gate

        def rigged_capture(sequences: Any, *args: Any, **kwargs: Any) -> Any:
            if any(s[0] == FAILS for s in sequences):
                raise RuntimeError("the target failed on purpose")
            if any(s[0] == WAITS for s in sequences):
                gate.wait(timeout=30)
            return capture(sequences, *args, **kwargs)

        service.target.capturer.capture = rigged_capture  # type: ignore[method-assign]
        service.target = replace(service.target, heads=BrokenHeads())  # type: ignore[arg-type]
        return service


class BrokenHeads:
    """Heads whose first read raises: a bug in the server, for `internal_error`."""

    @property
    def embed(self) -> Any:
        raise RuntimeError("a bug in the server")


@pytest.fixture(scope="module")
def servers(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(a server with a token and a checkpoint root, a server without a checkpoint root)."""
    tmp = tmp_path_factory.mktemp("codes")
    root = tmp / "checkpoints"
    root.mkdir()
    torch.save({"model_state_dict": {}}, root / "ok.pt")
    rigged = _Rigged()
    settings = serve_settings(tiny_target, tmp / "store", checkpoint_root=root, token=TOKEN, wait_s=0.2)
    plain = serve_settings(tiny_target, tmp / "store2")
    try:
        with serving_app(create_app(settings, build=rigged)) as url, serving_app(create_app(plain)) as plain_url:
            yield url, plain_url
    finally:
        rigged.gate.set()


@pytest.fixture
def client(servers: tuple[str, str]) -> Iterator[CacheClient]:
    with CacheClient(servers[0], token=TOKEN, timeout=30) as c:
        yield c


def _ready_prompt(client: CacheClient) -> str:
    [p] = client.register([{"token_ids": [5, 6, 7, 8]}])
    client.wait_ready([p.prompt_id], timeout_s=30)
    return p.prompt_id


def _claimed(jobs: JobsClient) -> tuple[str, str]:
    job = jobs.submit("ok.pt", prompts=[_ready_prompt(jobs.client)])
    while True:  # other tests may have left queued jobs: claim until this one is ours
        claim = jobs.claim("w", lease_s=60)
        assert claim is not None
        if claim.job.job_id == job.job_id:
            return job.job_id, claim.lease


def _registered(client: CacheClient, first_token: int) -> str:
    return client.register([{"token_ids": [first_token, 2, 3]}])[0].prompt_id


def _bad_http(c: CacheClient) -> Any:
    return c.hidden(_ready_prompt(c), list(range(20000)))  # a request line of ~110 kB


def _report_not_ready(c: CacheClient) -> Any:
    jobs = JobsClient(c)
    return jobs.report(jobs.submit("ok.pt", prompts=[_ready_prompt(c)]).job_id)


def _job_failed(c: CacheClient) -> Any:
    jobs = JobsClient(c)
    job_id, lease = _claimed(jobs)
    jobs.fail(job_id, lease, "refused", retryable=False)
    return jobs.report(job_id)


def _lease_lost(c: CacheClient) -> Any:
    jobs = JobsClient(c)
    return jobs.renew(_claimed(jobs)[0], "not-the-lease")


CASES: dict[ErrorCode, tuple[Callable[[CacheClient], Any], type[ApiError]]] = {
    ErrorCode.invalid_request: (lambda c: c.request("POST", "/prompts", json={"prompts": []}), InvalidRequestError),
    ErrorCode.invalid_prompt: (lambda c: c.register([{"token_ids": [10**6]}]), InvalidRequestError),
    ErrorCode.invalid_layers: (lambda c: c.hidden(_ready_prompt(c), [99]), InvalidRequestError),
    ErrorCode.unknown_prompts: (lambda c: JobsClient(c).submit("ok.pt", prompts=["nope"]), InvalidRequestError),
    ErrorCode.invalid_checkpoint_path: (lambda c: JobsClient(c).submit("../x.pt"), InvalidRequestError),
    ErrorCode.unknown_sets: (lambda c: c.request("GET", "/prompts", params={"set": "nope"}), InvalidRequestError),
    ErrorCode.bad_http_request: (_bad_http, BadRequestError),
    ErrorCode.not_found: (lambda c: c.request("GET", "/nowhere"), NotFoundError),
    ErrorCode.prompt_not_found: (lambda c: c.prompt("missing"), NotFoundError),
    ErrorCode.job_not_found: (lambda c: JobsClient(c).job("missing"), NotFoundError),
    ErrorCode.report_not_ready: (_report_not_ready, ReportNotReadyError),
    ErrorCode.method_not_allowed: (lambda c: c.request("PUT", "/model"), ApiError),
    ErrorCode.prompt_failed: (lambda c: c.hidden(_registered(c, FAILS), [1]), PromptFailedError),
    ErrorCode.job_failed: (_job_failed, JobFailedError),
    ErrorCode.lease_lost: (_lease_lost, LeaseLostError),
    ErrorCode.prompt_not_ready: (lambda c: c.hidden(_registered(c, WAITS), [1]), NotReadyError),
    ErrorCode.internal_error: (lambda c: c.heads(), ServerError),
}  # fmt: skip
# Reached only through their own servers or requests below, or not sendable by this server at all.
# server_unhealthy: tests/cache_server/compute/test_health.py (a dead loop would end this module's server);
# stored_data_corrupt: tests/cache_server/api/test_stored_data_corrupt.py (it corrupts a store's files);
# storage_exceeded: tests/cache_server/test_plan.py (a store on a 1 MiB file system) and
# tests/cache_server/test_store_full.py (a capture that fills it); store_read_only: there too (a read-only mount).
ELSEWHERE = {
    ErrorCode.unauthorized,
    ErrorCode.jobs_disabled,
    ErrorCode.http_error,
    ErrorCode.server_unhealthy,
    ErrorCode.stored_data_corrupt,
    ErrorCode.storage_exceeded,
    ErrorCode.store_read_only,
}


def test_every_code_is_exercised_and_mapped() -> None:
    assert set(CASES) | ELSEWHERE == set(ErrorCode) == set(STATUS)
    for code in ErrorCode:
        assert issubclass(error_class(code.status, code.value), ApiError)


@pytest.mark.parametrize("code", list(CASES), ids=str)
def test_code_end_to_end(client: CacheClient, code: ErrorCode) -> None:
    call, cls = CASES[code]
    with pytest.raises(cls) as info:
        call(client)
    assert (info.value.status, info.value.code) == (code.status, code.value)


WRITES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/prompts", {"prompts": [{"token_ids": [1, 2]}]}),
    ("POST", "/jobs", {"checkpoint": "ok.pt"}),
    ("POST", "/jobs/claim", {"worker": "w", "lease_s": 10}),
    ("POST", "/jobs/j/renew", {"lease": "l"}),
    ("POST", "/jobs/j/complete", {"lease": "l", "report": {}}),
    ("POST", "/jobs/j/fail", {"lease": "l", "error": "e", "retryable": True}),
    ("DELETE", "/jobs/j", None),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES, ids=[f"{m} {p}" for m, p, _ in WRITES])
def test_every_write_needs_the_token(servers: tuple[str, str], method: str, path: str, body: Any) -> None:
    with CacheClient(servers[0]) as anonymous, pytest.raises(UnauthorizedError) as info:
        anonymous.request(method, path, json=body)
    assert (info.value.status, info.value.code) == (401, "unauthorized")


def test_client_methods_raise_unauthorized_without_the_token(servers: tuple[str, str]) -> None:
    with CacheClient(servers[0]) as anonymous:
        with pytest.raises(UnauthorizedError):
            anonymous.register([{"token_ids": [1, 2, 3]}])
        with pytest.raises(UnauthorizedError):
            JobsClient(anonymous).submit("ok.pt")


def test_jobs_disabled_without_a_checkpoint_root(servers: tuple[str, str]) -> None:
    with CacheClient(servers[1]) as plain, pytest.raises(JobsDisabledError) as info:
        JobsClient(plain).submit("ok.pt")
    assert (info.value.status, info.value.code) == (403, "jobs_disabled")


def test_a_parser_level_400_is_a_json_error_body(servers: tuple[str, str]) -> None:
    url = urlsplit(servers[0])
    conn = http.client.HTTPConnection(url.hostname or "", url.port)
    conn.request("GET", "/hidden?prompt_id=p&layers=" + "1," * 40000)  # httpx refuses to send this
    r = conn.getresponse()
    body = json.loads(r.read())
    conn.close()
    assert r.status == 400 and r.getheader("content-type") == "application/json"
    assert body["error"]["code"] == "bad_http_request" and "64 KiB" in body["error"]["message"]
