"""What a target's `--model` must be: a local Hugging Face model directory (checked before anything is
loaded, so that a wrong path is one line, never a model-hub lookup)."""

from __future__ import annotations

from pathlib import Path


def check_model_dir(model_dir: Path) -> None:
    """FileNotFoundError unless `model_dir` is a Hugging Face model directory."""
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model {model_dir} is not a Hugging Face model directory (no config.json)")
