"""`eval-worker`'s settings as its commands build them: a flag wins over its EVAL_WORKER_ variable, which
wins over the default (pydantic-settings' order), the token and the heads cache included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eval_worker.cli import _parser

# every command that talks to a server, with the arguments it needs
TALKING = [
    ["serve"],
    ["submit", "runs/step_10.pt"],
    ["watch", "runs"],
    ["evaluate", "runs/step_10.pt", "--all-prompts"],
    ["prompts", "add", "gsm8k.jsonl", "--set", "gsm8k"],
    ["export", "out", "--format", "specforge-dflash", "--set", "gsm8k", "--layers", "1"],
    ["compare", "--server", "http://127.0.0.1:8000"],
]


def _settings(argv: list[str]) -> Any:
    args = _parser().parse_args(argv)
    return args.build_settings(args)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        _parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", TALKING, ids=lambda argv: " ".join(argv[:2]))
def test_the_token_is_a_flag_over_the_variable(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--token str" in _help(argv, capsys)  # shown, with the variable to prefer
    monkeypatch.delenv("EVAL_WORKER_TOKEN", raising=False)
    assert _settings(argv).token is None
    monkeypatch.setenv("EVAL_WORKER_TOKEN", "from-the-environment")
    assert _settings(argv).token == "from-the-environment"
    assert _settings([*argv, "--token", "from-the-flag"]).token == "from-the-flag"


def test_the_heads_cache_is_a_flag_over_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EVAL_WORKER_HEADS_CACHE", raising=False)
    for argv in (["serve"], ["evaluate", "step_10.pt", "--all-prompts"], ["doctor", "step_10.pt"]):
        assert "--heads-cache Path" in _help(argv, capsys)
        assert _settings(argv).heads_cache is None  # HeadsCache's default directory
        monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", "/env/heads")
        assert _settings(argv).heads_cache == Path("/env/heads")
        assert _settings([*argv, "--heads-cache", "/flag/heads"]).heads_cache == Path("/flag/heads")
        monkeypatch.delenv("EVAL_WORKER_HEADS_CACHE")
