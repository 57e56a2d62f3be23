"""A small tmpfs for tests of a full or read-only store: mounted as root, or, where mounting is refused,
the test run again in a user and mount namespace of its own (`unshare -rm`), where it may mount."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_IN_NAMESPACE = "HSC_TEST_IN_MOUNT_NAMESPACE"  # set in the run inside `unshare -rm`


def _mount(*args: str) -> str | None:
    """Run `mount args`; its error, or None."""
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    return (done.stderr.strip() or f"mount exited with {done.returncode}") if done.returncode else None


@contextmanager
def small_disk(request: pytest.FixtureRequest, mount: Path, size: str) -> Iterator[Path | None]:
    """A tmpfs of `size` (`512k`) at `mount`, unmounted afterwards. None when it could not be mounted
    here and the test was run, and passed, in a namespace of its own instead: the caller returns."""
    mount.mkdir(parents=True, exist_ok=True)
    refused = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount))
    if refused is None:
        try:
            yield mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=True)
        return
    if os.environ.get(_IN_NAMESPACE) or shutil.which("unshare") is None:
        pytest.skip(f"cannot mount a tmpfs ({refused}) and cannot run the test in a mount namespace")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs ({refused}) nor unshare a mount namespace ({probe.stderr.strip()})")
    cmd = ["unshare", "-rm", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", request.node.nodeid]
    rerun = subprocess.run(cmd, cwd=ROOT, env={**os.environ, _IN_NAMESPACE: "1"}, capture_output=True, text=True)
    assert rerun.returncode == 0, f"in a mount namespace of its own:\n{rerun.stdout[-4000:]}\n{rerun.stderr[-2000:]}"
    yield None


def remount(mount: Path, mode: str) -> None:
    """Remount the tmpfs `ro` or `rw`."""
    refused = _mount("-o", f"remount,{mode}", str(mount))
    assert refused is None, refused


def free_bytes(path: Path) -> int:
    """Free bytes on the file system of `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def files_under(path: Path) -> list[str]:
    """Every file under `path`, relative to it, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
