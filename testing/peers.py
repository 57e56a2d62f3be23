"""Checkpoints written by the peers' own libraries (speculators, SpecForge), from their own virtual
environment (`.venv-peers` or `$HSC_PEERS_VENV`, built by `./dev test`): `peer_checkpoints.py` runs there."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("peer_checkpoints.py")


def peers_python() -> Path | None:
    """The peers' environment's interpreter, if it is built."""
    path = Path(os.environ.get("HSC_PEERS_VENV", REPO / ".venv-peers")) / "bin" / "python"
    return path if path.exists() else None


def run_in_peers(script: Path, *args: str | Path) -> str:
    """`script`'s stdout, run with `args` by the peers' environment's Python with this repository on its
    PYTHONPATH (RuntimeError naming the script when the environment is missing or the script fails)."""
    python = peers_python()
    if python is None:
        raise RuntimeError("the peers' environment .venv-peers is missing: ./dev test (or .ci/run) builds it")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [str(python), str(script), *map(str, args)], capture_output=True, text=True, timeout=600, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def _run(*args: str | Path) -> str:
    return run_in_peers(SCRIPT, *args)


def write_peer_checkpoints(target: Path, out: Path) -> dict[str, Path]:
    """Every checkpoint `peer_checkpoints.py` writes for `target`, by name."""
    names = json.loads(_run("write", target, out).strip().splitlines()[-1])
    return {name: out / name for name in names}


def speculators_drafts(checkpoint: Path, taps: Tensor, token_ids: Tensor, work: Path) -> Tensor:
    """speculators' own greedy first drafts (draft ids) for one sequence: position i reads taps[i] and
    token i+1, as this project's EAGLE-3 prefill pairs them."""
    save_file(
        {"hidden_states": taps[None, :-1].contiguous(), "input_ids": token_ids[None, 1:].contiguous()},
        work / "in.safetensors",
    )
    _run("drafts", checkpoint, work / "in.safetensors", work / "out.safetensors")
    return load_file(work / "out.safetensors")["draft_ids"][0]
