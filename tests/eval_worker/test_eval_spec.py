"""One validation of what an evaluation measures, whichever way it comes in: the command line
(`evaluate`, `submit`, `watch`), `POST /jobs`, or the spec and its family blocks in code."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions
from tests.cache_server.helpers import app_client

BAD = [
    (["--tree-budget", "0"], "tree_budgets: tree budgets must be in 1..4096, got [0]"),
    (["--tree-budget", "-3"], "tree_budgets: tree budgets must be in 1..4096, got [-3]"),
    (["--tree-budget", "8", "--tree-budget", "8"], "tree_budgets: tree budgets must be distinct, got [8] more"),
    (["--steps", "0"], "steps: steps must be in 1..64, got 0"),
    (["--eagle-tree", "4,3,16", "--eagle-tree", "4, 3, 16"], "eagle_trees: EAGLE trees must be distinct"),
]  # fmt: skip
BODY = {"--tree-budget": "tree_budgets", "--steps": "steps", "--eagle-tree": "eagle_trees"}


@pytest.mark.parametrize(("flags", "message"), BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
@pytest.mark.parametrize("command", ["evaluate", "submit", "watch"])
def test_the_command_line_refuses_with_one_message(
    command: str, flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = str(tmp_path / ("runs" if command == "watch" else "ckpt.pt"))
    server = "http://127.0.0.1:9"  # never reached: the options are refused first
    prompts = ["--all-prompts"] if command == "evaluate" else []
    assert main([command, target, "--server", server, *prompts, *flags]) == ExitCode.usage
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_post_jobs_refuses_with_the_same_message(
    flags: list[str], message: str, tiny_target: Path, tmp_path: Path
) -> None:
    body: dict[str, object] = {"checkpoint": "ckpt.pt"}
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        field = BODY[flag]
        body[field] = (
            int(value) if field == "steps" else [*body.get(field, []), int(value) if field == "tree_budgets" else value]
        )  # type: ignore[list-item]
    (tmp_path / "root").mkdir()
    with app_client(tiny_target, tmp_path / "store", checkpoint_root=tmp_path / "root") as client:
        r = client.post("/jobs", json=body)
    assert r.status_code == 422 and message.split(": ", 1)[1] in r.json()["error"]["message"]


def test_the_family_blocks_in_code_are_checked_the_same() -> None:
    with pytest.raises(ValidationError, match=r"tree budgets must be in 1\.\.4096, got \[0\]"):
        DFlashOptions(tree_budgets=[0])
    for block in (Eagle3Options, MtpOptions):
        with pytest.raises(ValidationError, match=r"steps must be in 1\.\.64, got 0"):
            block(steps=0)
    assert EvalSpec(family_options=DFlashOptions(tree_budgets=[3, 8])).asks_trees


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "3"], "--steps applies to EAGLE-3 and MTP drafters: say which with --family"),
        (
            ["--tree-budget", "4", "--eagle-tree", "4,3,16"],
            "belong to different drafter families (DFlash and EAGLE-3): give one family's options",
        ),
        (["--family", "mtp", "--tree-budget", "4"], "--tree-budget applies to DFlash drafters, not --family mtp"),
        (["--inert-config-keys", "a,,b"], "inert config keys must not be empty strings"),
    ],
)
@pytest.mark.parametrize("command", ["submit", "watch"])
def test_submit_refuses_options_whose_family_is_not_clear(
    command: str, flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`submit` and `watch` load no checkpoint: the flags must say which family's block they fill."""
    target = str(tmp_path / ("runs" if command == "watch" else "ckpt.pt"))
    assert main([command, target, "--server", "http://127.0.0.1:9", *flags]) == ExitCode.usage
    assert message in capsys.readouterr().err
