"""`docker compose up`, really: both images built from services/Dockerfile on a local Debian base, the
CPU file (docker-compose.cpu.yml) started, prompts registered through the published port, a checkpoint
evaluated by a worker container, and everything torn down, whatever happens."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoConfig

from cache_server.capture.fingerprint import target_fingerprint
from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient, JobsClient
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.eval_spec import DFlashOptions, EvalSpec
from schemas.jobs import JobStatus
from testing.checkpoints import save_hf_checkpoint
from testing.docker import (
    DOCKER,
    ROOT,
    DockerUnavailable,
    build_image,
    compose_command,
    docker_engine,
    ensure_base_image,
    ensure_torch_wheel,
)
from testing.servers import free_port, wait_healthy
from testing.tiny_trainer import tiny_drafter_config

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SERVER_IMAGE, WORKER_IMAGE = "hidden-state-cache/cache-server:cpu", "hidden-state-cache/eval-worker:cpu"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    try:
        with docker_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log"):
            yield
    except DockerUnavailable as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{e} (CI runs this test as root)")


def _checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """The target the server container writes (the demo's shape), and a DFlash checkpoint for it in a
    directory the containers' non-root user can read."""
    target = build_tiny_model(tmp_path / "target", hidden=128, head_dim=32, logit_scale=8.0)
    torch.manual_seed(0)
    config = tiny_drafter_config(AutoConfig.from_pretrained(target), [1, 3, 5], block_size=4)
    runs = tmp_path / "runs"
    save_hf_checkpoint(runs / "step_10", DFlashDrafter(config, 3), global_step=10)
    for path in [tmp_path, *runs.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target, runs


def test_the_cpu_compose_file_runs_the_whole_system(engine: None, tmp_path: Path) -> None:
    ensure_torch_wheel()
    seconds = {"base image": 0.0}
    started = time.monotonic()
    if ensure_base_image():
        seconds["base image"] = time.monotonic() - started
    seconds["server image"] = build_image("server", "server", SERVER_IMAGE)
    seconds["worker image"] = build_image("worker", "worker", WORKER_IMAGE)
    probe = "import importlib.util as u; print(*[m for m in ('transformers', 'zarr', 'fastapi') if u.find_spec(m)])"
    run = [DOCKER, "run", "--rm", "--entrypoint", "python", WORKER_IMAGE, "-c", probe]
    found = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
    assert found == "", f"the worker image holds {found}"

    port, project = free_port(), f"hsc-test-{os.getpid()}"
    compose = [*compose_command(), "-f", str(ROOT / "docker-compose.cpu.yml"), "-p", project]
    target, runs = _checkpoints(tmp_path)
    env = {**os.environ, "PUBLISH_PORT": str(port), "CHECKPOINT_DIR": str(runs)}
    env["CPU_BASE_IMAGE"] = "hidden-state-cache/base:bookworm"
    try:
        started = time.monotonic()
        subprocess.run([*compose, "up", "-d"], env=env, check=True, capture_output=True, timeout=300)
        url = f"http://127.0.0.1:{port}"
        # `up -d` already waited for it where Compose honours the health condition; docker-compose 1.29 may not.
        wait_healthy(url, None, None, timeout_s=120)
        seconds["up, healthy"] = time.monotonic() - started
        with CacheClient(url) as client:
            ids = [
                p.prompt_id
                for p in client.register([{"text": "def fib(n):"}, {"text": "The quick brown fox"}], max_new_tokens=12)
            ]
            client.wait_ready(ids, timeout_s=120)
            jobs = JobsClient(client)
            job = jobs.submit("step_10", spec=EvalSpec(family_options=DFlashOptions(tree_budgets=[4])))
            final = jobs.wait(job.job_id, timeout_s=300, poll_s=0.5)
            assert final.status == JobStatus.done, final.error
            report = jobs.report(job.job_id)
            seconds["job"] = time.monotonic() - started - seconds["up, healthy"]
            # The container wrote the very target built here (and by the demo): the same bytes.
            assert report.target_fingerprint == client.model().fingerprint == target_fingerprint(target, "float32")
            assert sorted(p.prompt_id for p in report.prompts) == sorted(ids)
            assert report.summary.chain.mean_tau is not None and report.summary.trees[4].mean_tau is not None
            workers = subprocess.run(
                [*compose, "ps", "-q", "eval-worker-1", "eval-worker-2"], env=env, capture_output=True, text=True
            ).stdout.split()
            assert final.worker is not None and final.worker.split(":")[0] in {w[:12] for w in workers}
        page = httpx.get(url + "/", timeout=10)
        assert page.status_code == 200 and 'id="board"' in page.text  # the leaderboard page
    finally:
        logs = subprocess.run([*compose, "logs", "--no-color"], env=env, capture_output=True, text=True).stdout
        subprocess.run([*compose, "down", "-t", "2", "-v"], env=env, capture_output=True, timeout=120)
    print("compose test seconds:", {k: round(v, 1) for k, v in seconds.items()}, f"\nlogs tail:\n{logs[-1500:]}")
