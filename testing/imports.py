"""Which heavy modules a snippet of Python loads, run in a fresh interpreter: the command lines' tests
check that `--help` and the light commands import only what they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a command line must not pay for unless its command runs them: the client (with numpy, ml_dtypes and
# httpx), the tensor and model libraries (and the model hub's), the store, the HTTP server, plots, datasets.
HEAVY = (
    "cache_server.client",
    "numpy",
    "ml_dtypes",
    "httpx",
    "torch",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "zarr",
    "fastapi",
    "uvicorn",
    "matplotlib",
    "datasets",
)


def modules_loaded(code: str) -> set[str]:
    """The modules in `sys.modules` once `code` has run in a fresh interpreter (this checkout first on its
    path); a `SystemExit` (argparse's after `--help`) ends `code`, not the check."""
    script = f"import json, sys\ntry:\n    exec({code!r})\nexcept SystemExit:\n    pass\n"
    script += "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def heavy_modules_loaded(code: str) -> list[str]:
    """The modules of HEAVY that `code` loads (`modules_loaded`)."""
    loaded = modules_loaded(code)
    return [m for m in HEAVY if m in loaded]
