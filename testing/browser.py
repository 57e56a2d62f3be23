"""Headless Chromium (Debian's `chromium`) for the leaderboard page: the browser test and the demo's
screenshot run it the same way."""

from __future__ import annotations

import shutil
import subprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def headless(url: str, *args: str, window: tuple[int, int] = (1280, 1100)) -> str:
    """Load `url` in headless Chromium in a `window` (width, height: a screenshot's size), given time for
    the page's fetches, with extra `args` (`--dump-dom`, `--screenshot=PATH`); its stdout. RuntimeError
    where Chromium is not installed."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (.ci/run installs it with apt-get)")
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--virtual-time-budget=10000",
        f"--window-size={window[0]},{window[1]}",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
