"""An S3 endpoint on loopback for tests and benches: moto's standalone server as a child process,
reached through the same AWS_* environment variables a deployment sets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from testing.servers import free_port

BUCKET = "hidden-state-cache-test"


@contextmanager
def moto_server(log: Path) -> Iterator[dict[str, str]]:
    """Starts moto on 127.0.0.1 with one bucket; yields the AWS_* variables that reach it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.put(f"{endpoint}/{BUCKET}", timeout=1).status_code == 200:  # CreateBucket
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("moto did not start in 60 s")
            time.sleep(0.1)
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
        }
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def fresh_prefix() -> str:
    """An `s3://` URL no other test uses."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@contextmanager
def aws_environment(env: dict[str, str]) -> Iterator[None]:
    """`env` in os.environ (where obstore reads it) for the duration."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
