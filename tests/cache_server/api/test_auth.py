"""With `token` set, every write needs `Authorization: Bearer <token>`; reads stay open."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.cache_server.helpers import app_client, serve_settings
from tests.cache_server.jobs_helpers import checkpoint_tree, report_body

TOKEN = "s3cret-token"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
BAD_HEADERS = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Bearer "}]


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root, _ = checkpoint_tree(tmp_path_factory.mktemp("ckpts"))
    store = tmp_path_factory.mktemp("store")
    with app_client(tiny_target, store, checkpoint_root=root, token=TOKEN) as client:
        yield client


def _writes(job_id: str) -> list[tuple[str, dict]]:
    lease = {"lease": "x"}
    return [
        ("/prompts", {"prompts": [{"token_ids": [1, 2, 3]}]}),
        ("/jobs", {"checkpoint": "hf"}),
        ("/jobs/claim", {"worker": "w", "lease_s": 30}),
        (f"/jobs/{job_id}/renew", lease),
        (f"/jobs/{job_id}/complete", {**lease, "report": report_body()}),
        (f"/jobs/{job_id}/fail", {**lease, "error": "e", "retryable": True}),
    ]


@pytest.mark.parametrize("headers", BAD_HEADERS)
def test_writes_without_the_token_are_refused(served, headers: dict) -> None:  # type: ignore[no-untyped-def]
    client = served
    before = client.get("/jobs").json()["total"]
    for path, body in _writes("any"):
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    assert client.delete("/jobs/any", headers=headers).status_code == 401
    assert client.get("/jobs").json()["total"] == before


def test_writes_with_the_token_and_open_reads(served) -> None:  # type: ignore[no-untyped-def]
    client = served
    r = client.post("/prompts", json={"prompts": [{"token_ids": [1, 2, 3]}]}, headers=GOOD)
    assert r.status_code == 202, r.text
    pid = r.json()["prompts"][0]["prompt_id"]
    r = client.post("/jobs", json={"checkpoint": "hf", "prompts": [pid]}, headers=GOOD)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    claim = client.post("/jobs/claim", json={"worker": "w", "lease_s": 30}, headers=GOOD).json()
    assert claim["job"]["job_id"] == job_id
    lease = {"lease": claim["lease"]}
    assert client.post(f"/jobs/{job_id}/renew", json=lease, headers=GOOD).status_code == 200
    done = client.post(f"/jobs/{job_id}/complete", json={**lease, "report": report_body()}, headers=GOOD)
    assert done.status_code == 200, done.text

    for path in ("/healthz", "/model", "/prompts", f"/prompts/{pid}", "/jobs", f"/jobs/{job_id}"):
        assert client.get(path).status_code == 200, path
    assert client.get(f"/jobs/{job_id}/report").json() == report_body()


def test_without_a_token_writes_are_open(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        r = client.post("/prompts", json={"prompts": [{"token_ids": [1, 2]}]}, headers={"Authorization": "Bearer x"})
        assert r.status_code == 202, r.text


def test_a_blank_token_is_refused_rather_than_disabling_auth(tiny_target: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="token must not be empty"):
        serve_settings(tiny_target, tmp_path, token="  ")
