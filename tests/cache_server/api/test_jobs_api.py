"""`/jobs` through the app: submissions are checked (paths, prompts, budgets), workers claim and finish."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cache_server.cli import main
from tests.cache_server.helpers import app_client, error_message
from tests.cache_server.jobs_helpers import checkpoint_tree, report_body

TOKENS = [5, 17, 300, 42, 9]


@pytest.fixture(scope="module")
def served(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root, _ = checkpoint_tree(tmp_path_factory.mktemp("ckpts"))
    with app_client(tiny_target, tmp_path_factory.mktemp("store"), checkpoint_root=root) as client:
        r = client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}, {"token_ids": TOKENS[:3]}]})
        yield client, root, [p["prompt_id"] for p in r.json()["prompts"]]


def _drain(client: TestClient) -> None:
    """Finish whatever is claimable so that each test starts with no queued job."""
    while (r := client.post("/jobs/claim", json={"worker": "drain", "lease_s": 60})).status_code == 200:
        claim = r.json()
        client.post(
            f"/jobs/{claim['job']['job_id']}/complete",
            json={"lease": claim["lease"], "report": report_body()},
        )


def test_submit_and_read_back(served) -> None:  # type: ignore[no-untyped-def]
    client, root, pids = served
    r = client.post("/jobs", json={"checkpoint": "hf", "prompts": pids[:1], "tree_budgets": [16, 64]})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "queued" and job["job_id"]
    assert (job["checkpoint"], job["checkpoint_relative"]) == (str((root / "hf").resolve()), "hf")
    assert (job["prompts"], job["tree_budgets"], job["target_layer_ids"], job["block_size"]) == (
        pids[:1],
        [16, 64],
        None,
        None,
    )
    fingerprint = client.get("/model").json()["fingerprint"]
    assert (job["target_fingerprint"], job["attempts"], job["max_attempts"]) == (fingerprint, 0, 3)
    assert client.get(f"/jobs/{job['job_id']}").json() == job

    r = client.post(
        "/jobs",
        json={"checkpoint": str(root / "runs/step100.pt"), "target_layer_ids": [1, 3], "block_size": 8},
    )
    assert r.status_code == 202, r.text
    assert (r.json()["prompts"], r.json()["target_layer_ids"]) == ("all", [1, 3])
    _drain(client)


@pytest.mark.parametrize(
    ("checkpoint", "needle"),
    [
        ("../outside/stolen.pt", "outside the checkpoint root"),
        ("/etc/passwd", "outside the checkpoint root"),
        ("escape.pt", "outside the checkpoint root"),
        ("linked", "outside the checkpoint root"),
        ("nothing/here.pt", "does not exist"),
        ("notes.txt", "not a torch.save archive"),
        ("half", "is incomplete: a checkpoint directory holds config.json"),
        ("x" * 300 + ".pt", "cannot be resolved"),  # longer than a file name may be
    ],
)
def test_bad_checkpoint_paths(served, checkpoint: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    before = client.get("/jobs").json()["total"]
    message = error_message(client.post("/jobs", json={"checkpoint": checkpoint}), 422, "invalid_checkpoint_path")
    assert needle in message
    assert client.get("/jobs").json()["total"] == before


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tree_budgets": [0]}, "1..4096"),
        ({"tree_budgets": [-3, 8]}, "1..4096"),
        ({"tree_budgets": [5000]}, "1..4096"),
        ({"tree_budgets": [8, 8, 16]}, "distinct"),
        ({"tree_budgets": ["many"]}, "tree_budgets"),
        ({"prompts": "some"}, 'prompts must be "all"'),
        ({"prompts": []}, "must not be empty"),
        ({"target_layer_ids": [1, 1]}, "distinct"),
        ({"target_layer_ids": [-1]}, ">= 0"),
        ({"target_layer_ids": [2, 6]}, "[6] are outside the target's 0..5"),
        ({"block_size": 1}, "block_size"),
        ({"target_layer_ids": [True, 2]}, "target_layer_ids"),  # ids are plain integers, not booleans
        ({"target_layer_ids": ["1", "2"]}, "target_layer_ids"),
        ({"tree_budgets": [8.0]}, "tree_budgets"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_submissions(served, extra: dict, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    assert needle in error_message(client.post("/jobs", json={"checkpoint": "hf", **extra}), 422)


def test_a_flat_body_and_its_block_queue_the_same_spec(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    options = {"tree_budgets": [4], "block_size": 6, "mask_token_id": 3}
    flat = client.post("/jobs", json={"checkpoint": "hf", **options})
    block = client.post("/jobs", json={"checkpoint": "hf", "family_options": {"family": "dflash", **options}})
    assert flat.status_code == block.status_code == 202, flat.text
    assert flat.json()["spec"] == block.json()["spec"]
    assert flat.json()["spec"]["family_options"] == {"family": "dflash", **options}
    assert (flat.json()["tree_budgets"], flat.json()["block_size"]) == ([4], 6)  # what older clients read
    steps = client.post("/jobs", json={"checkpoint": "hf", "family_options": {"family": "mtp", "steps": 3}})
    assert (steps.json()["steps"], steps.json()["spec"]["family_options"]) == (3, {"family": "mtp", "steps": 3})
    _drain(client)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("../outside/hf/config.json", "resolves outside the checkpoint root"),
        ("escape.pt/config.json", "resolves outside the checkpoint root"),
        ("nope.json", "is not a file under"),
        ("runs", "is not a file under"),
    ],
)
def test_a_jobs_config_must_be_a_file_under_the_root(served, config: str, needle: str) -> None:  # type: ignore[no-untyped-def]
    client, root, _ = served
    r = client.post("/jobs", json={"checkpoint": "runs/step100.pt", "config": config})
    assert needle in error_message(r, 422, "invalid_checkpoint_path")
    ok = client.post("/jobs", json={"checkpoint": "runs/step100.pt", "config": "half/config.json"})
    assert ok.status_code == 202 and ok.json()["spec"]["config"] == str((root / "half" / "config.json").resolve())
    _drain(client)


def test_unknown_prompt_ids_are_named(served) -> None:  # type: ignore[no-untyped-def]
    client, _, pids = served
    r = client.post("/jobs", json={"checkpoint": "hf", "prompts": [pids[0], "nope1", "nope2"]})
    message = error_message(r, 422, "unknown_prompts")
    assert "'nope1', 'nope2'" in message and pids[0] not in message


def test_a_worker_claims_completes_and_the_report_is_served(served) -> None:  # type: ignore[no-untyped-def]
    client, root, pids = served
    _drain(client)
    job_id = client.post("/jobs", json={"checkpoint": "inner.pt"}).json()["job_id"]
    assert error_message(client.get(f"/jobs/{job_id}/report"), 404, "report_not_ready")

    r = client.post("/jobs/claim", json={"worker": "gpu-0", "lease_s": 30})
    assert r.status_code == 200, r.text
    claim = r.json()
    assert claim["job"]["job_id"] == job_id and claim["job"]["status"] == "running"
    assert claim["job"]["checkpoint"] == str((root / "runs/step100.pt").resolve())
    assert sorted(claim["prompt_ids"]) == sorted(pids)  # "all" resolved at the claim
    assert client.post("/jobs/claim", json={"worker": "gpu-1", "lease_s": 30}).status_code == 204

    renewed = client.post(f"/jobs/{job_id}/renew", json={"lease": claim["lease"], "lease_s": 120})
    assert renewed.status_code == 200 and renewed.json()["lease_expires_at"] > claim["job"]["lease_expires_at"]
    bad_report = {"lease": claim["lease"], "report": {"checkpoint_path": "x"}}
    error_message(client.post(f"/jobs/{job_id}/complete", json=bad_report), 422)
    assert client.get(f"/jobs/{job_id}").json()["status"] == "running"  # a refused report changes nothing
    wrong = {"lease": "not-the-lease", "report": report_body("thief")}
    error_message(client.post(f"/jobs/{job_id}/complete", json=wrong), 409, "lease_lost")

    done = client.post(f"/jobs/{job_id}/complete", json={"lease": claim["lease"], "report": report_body("gpu-0")})
    assert done.status_code == 200 and done.json()["status"] == "done"
    again = {"lease": claim["lease"], "report": report_body("late")}
    error_message(client.post(f"/jobs/{job_id}/complete", json=again), 409, "lease_lost")
    report = client.get(f"/jobs/{job_id}/report")
    assert report.status_code == 200 and report.json() == report_body("gpu-0")
    assert [j["job_id"] for j in client.get("/jobs", params={"status": "done"}).json()["jobs"]][-1] == job_id


def test_a_refused_checkpoint_fails_the_job_without_retries(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    _drain(client)
    job_id = client.post("/jobs", json={"checkpoint": "hf"}).json()["job_id"]
    claim = client.post("/jobs/claim", json={"worker": "w", "lease_s": 30}).json()
    body = {"lease": claim["lease"], "error": "CheckpointRefused: no fc.weight", "retryable": False}
    failed = client.post(f"/jobs/{job_id}/fail", json=body).json()
    assert (failed["status"], failed["attempts"], failed["error"]) == ("failed", 1, body["error"])
    assert "no fc.weight" in error_message(client.get(f"/jobs/{job_id}/report"), 409, "job_failed")
    assert client.post("/jobs/claim", json={"worker": "w", "lease_s": 30}).status_code == 204
    assert job_id in [j["job_id"] for j in client.get("/jobs", params={"status": "failed"}).json()["jobs"]]


def test_unknown_jobs_and_bad_worker_bodies(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    error_message(client.get("/jobs/nope"), 404, "job_not_found")
    error_message(client.get("/jobs/nope/report"), 404, "job_not_found")
    error_message(client.post("/jobs/nope/renew", json={"lease": "x"}), 404, "job_not_found")
    error_message(client.post("/jobs/claim", json={"worker": "", "lease_s": 30}), 422)
    error_message(client.post("/jobs/claim", json={"worker": "w", "lease_s": 0}), 422)
    error_message(client.get("/jobs", params={"status": "lost"}), 422)


def test_without_a_checkpoint_root_jobs_are_refused_but_kept(  # type: ignore[no-untyped-def]
    tiny_target: Path, tmp_path: Path
) -> None:
    root, _ = checkpoint_tree(tmp_path / "ckpts")
    store = tmp_path / "store"
    with app_client(tiny_target, store, checkpoint_root=root) as client:
        job_id = client.post("/jobs", json={"checkpoint": "hf"}).json()["job_id"]
    with app_client(tiny_target, store) as client:  # restarted without --checkpoint-root
        message = error_message(client.post("/jobs", json={"checkpoint": "hf"}), 403, "jobs_disabled")
        assert "--checkpoint-root" in message
        assert client.get(f"/jobs/{job_id}").json()["status"] == "queued"  # survived the restart
        assert client.post("/jobs/claim", json={"worker": "w", "lease_s": 5}).json()["job"]["job_id"] == job_id
    assert (store / "coordination.sqlite").is_file()


def test_serve_refuses_a_missing_checkpoint_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "serve",
        "--model",
        str(tmp_path),
        "--store",
        str(tmp_path),
        "--checkpoint-root",
        str(tmp_path / "x"),
    ]
    assert main(args) == 2
    assert "is not an existing directory" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--store", str(tmp_path), "--job-max-attempts", "0"]) == 2


def test_jobs_are_deleted_unless_running_and_a_running_one_is_cancelled(served) -> None:  # type: ignore[no-untyped-def]
    client, _, pids = served
    _drain(client)
    queued = client.post("/jobs", json={"checkpoint": "hf", "prompts": pids[:1]}).json()["job_id"]
    running = client.post("/jobs", json={"checkpoint": "hf", "prompts": pids[:1]}).json()["job_id"]
    assert client.delete(f"/jobs/{queued}").status_code == 204
    error_message(client.get(f"/jobs/{queued}"), 404, "job_not_found")
    claim = client.post("/jobs/claim", json={"worker": "w", "lease_s": 60}).json()
    assert claim["job"]["job_id"] == running  # the deleted job is never claimed
    cancelling = client.delete(f"/jobs/{running}")
    assert (cancelling.status_code, cancelling.json()["status"]) == (202, "cancelling")
    renewed = client.post(f"/jobs/{running}/renew", json={"lease": claim["lease"]})
    assert renewed.json()["status"] == "cancelling"  # how its worker learns it
    client.post(f"/jobs/{running}/complete", json={"lease": claim["lease"], "report": report_body()})
    assert client.get(f"/jobs/{running}").json()["status"] == "done"  # it finished before its worker heard
    assert client.delete(f"/jobs/{running}").status_code == 204  # done: removed with its report
    error_message(client.get(f"/jobs/{running}/report"), 404, "job_not_found")
    error_message(client.delete("/jobs/nope"), 404, "job_not_found")
