"""`cache-server`'s command line: `tiny-model` writes a model that plain transformers loads offline, bad
options are one line, and `--help` loads nothing heavy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cache_server.cli import main
from testing.imports import heavy_modules_loaded


def test_tiny_model_loads_with_auto_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHE_SERVER_TINY_HIDDEN", "48")  # environment fills what the command line leaves out
    assert main(["tiny-model", str(tmp_path / "m"), "--layers", "3", "--vocab", "400"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (3, 48, 400)
    assert model.config.model_type == "qwen3"
    ids = tokenizer("def fib(n):").input_ids
    assert tokenizer.decode(ids) == "def fib(n):" and max(ids) < 400


def test_bad_options_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tiny-model", str(tmp_path / "m"), "--vocab", "10"]) == 2
    assert "--vocab must be at least" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--store", str(tmp_path), "--capture-layers", "1,x"]) == 2
    assert main(["serve", "--model", str(tmp_path), "--store", "s3://bucket/prefix"]) == 2
    assert "--db is required with an s3:// store" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--store", str(tmp_path), "--db", "mysql://h/db"]) == 2
    assert "use a SQLite path, sqlite:///path or postgresql://" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--store", "gs://bucket"]) == 2
    assert "s3://bucket/prefix" in capsys.readouterr().err


def test_serve_refuses_a_missing_model_or_gpu_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_target: Path
) -> None:
    assert main(["serve", "--model", str(tmp_path / "nope"), "--store", str(tmp_path)]) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["serve", "--model", str(tiny_target), "--store", str(tmp_path), "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_engine_capture_options_are_refused_unless_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serve = ["serve", "--model", str(tmp_path), "--store", str(tmp_path)]
    assert main([*serve, "--capture", "engine", "--engine-files", str(tmp_path)]) == 2
    assert "--capture engine needs --generator URL (the engine) and --engine-files DIR" in capsys.readouterr().err
    assert main([*serve, "--capture", "engine", "--generator", "http://127.0.0.1:9/v1"]) == 2
    assert "--engine-files DIR" in capsys.readouterr().err
    engine = ["--capture", "engine", "--generator", "http://127.0.0.1:9", "--engine-files", str(tmp_path)]
    assert main([*serve, *engine, "--device-map", "auto"]) == 2
    assert "the engine places it" in capsys.readouterr().err
    assert main([*serve, "--engine-files", str(tmp_path)]) == 2
    assert "--engine-files is read by --capture engine only" in capsys.readouterr().err


def test_engine_capture_with_no_engine_stops_the_start_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_target: Path
) -> None:
    engine = ["--capture", "engine", "--generator", "http://127.0.0.1:9/v1", "--engine-files", str(tmp_path)]
    assert main(["serve", "--model", str(tiny_target), "--store", str(tmp_path / "s"), *engine]) == 2
    assert "cache-server: --generator http://127.0.0.1:9: GET /v1/models failed" in capsys.readouterr().err


def test_help_of_every_command_loads_no_heavy_module() -> None:
    code = "import argparse\nfrom cache_server.cli import _parser\nparser = _parser()\n"
    code += "commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices\n"
    code += "assert sorted(commands) == ['plan', 'prune', 'serve', 'tiny-model']\n"
    code += "[sub.format_help() for sub in commands.values()]\nparser.parse_args(['serve', '--help'])\n"
    assert heavy_modules_loaded(code) == []
