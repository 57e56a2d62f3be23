"""A Docker engine for the deployment test: dockerd started (and Debian's docker.io, debootstrap and
docker-compose installed, as root) when absent, the CPU base image built locally once
(`services/cpu-base.sh`; the engine keeps it between runs), the CPU torch wheel in the build's
wheelhouse, and the images built with the host's CA bundle as a build secret."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "hidden-state-cache/base:bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's, with any CA that intercepts its TLS
# Debian's 20.10 client builds with BuildKit on its own; a newer client on PATH may want buildx.
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


class DockerUnavailable(Exception):
    """No Docker engine here, and none can be installed (not root, or no apt)."""


def _run(*cmd: str, timeout: float = 900, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _apt_install(*packages: str) -> None:
    missing = [p for p in packages if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise DockerUnavailable(f"{', '.join(missing)} not installed, and installing needs root and apt-get")
    _run("apt-get", "update", "-q")
    _run("apt-get", "install", "-y", "-q", *missing, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _engine_answers() -> bool:
    return subprocess.run([DOCKER, "info"], capture_output=True, timeout=60).returncode == 0


@contextmanager
def docker_engine(log: Path) -> Iterator[None]:
    """A running dockerd: the one already running, or one started here (and stopped after)."""
    if shutil.which("dockerd") is None:
        _apt_install("docker.io")
    if _engine_answers():
        yield
        return
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd is not running, and starting it needs root")
    with log.open("wb") as out:
        daemon = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start; see {log}")
            time.sleep(0.5)
        yield
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where the client has it, else docker-compose 1.29 (Debian's)."""
    if subprocess.run([DOCKER, "compose", "version"], capture_output=True).returncode == 0:
        return [DOCKER, "compose"]
    _apt_install("docker-compose")
    return ["docker-compose"]


def ensure_base_image() -> bool:
    """The local CPU base image, built unless the engine has it; True if it was built now."""
    if subprocess.run([DOCKER, "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0:
        return False
    _apt_install("debootstrap")
    _run(
        str(ROOT / "services" / "cpu-base.sh"),
        BASE_IMAGE,
        env={**os.environ, "PATH": f"{Path(DOCKER).parent}:{os.environ['PATH']}"},
    )
    return True


def ensure_torch_wheel() -> None:
    """The CPU torch wheel this environment runs, in services/wheelhouse (pip finds it on disk)."""
    import torch

    wheelhouse = ROOT / "services" / "wheelhouse"
    if not list(wheelhouse.glob("torch-*.whl")):
        version = torch.__version__
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q"]
        _run(*pip, "--dest", str(wheelhouse), f"torch=={version}")


def build_image(target: str, extras: str, tag: str) -> float:
    """`docker build` of one stage on the local base; seconds it took."""
    cmd = [DOCKER, "build", "-q", "-f", "services/Dockerfile", "--target", target, "-t", tag]
    cmd += ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"EXTRAS={extras}"]
    if CA_BUNDLE.exists():
        cmd += ["--secret", f"id=ca_bundle,src={CA_BUNDLE}"]
    started = time.monotonic()
    _run(*cmd, str(ROOT), env={**os.environ, "DOCKER_BUILDKIT": "1"})
    return time.monotonic() - started
