"""`eval-worker`'s `--help` (of every command) and `compare` on report files import none of the heavy
modules: the client, numpy and ml_dtypes are loaded by the commands that talk to a server."""

from __future__ import annotations

from pathlib import Path

from schemas.report import EvalReport
from testing.imports import heavy_modules_loaded
from tests.cache_server.jobs_helpers import report_body

EVERY_HELP = """
import argparse
from eval_worker.cli import _parser
parser = _parser()
commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
for name, sub in commands.items():
    sub.format_help()
    for action in sub._actions:  # `prompts add`
        if isinstance(action, argparse._SubParsersAction):
            [leaf.format_help() for leaf in action.choices.values()]
parser.parse_args(["compare", "--help"])
"""


def test_help_of_every_command_loads_no_heavy_module() -> None:
    assert heavy_modules_loaded(EVERY_HELP) == []


def test_compare_of_report_files_loads_no_heavy_module(tmp_path: Path) -> None:
    report = tmp_path / "step_10.json"
    report.write_text(EvalReport.model_validate(report_body()).model_dump_json())
    code = f"from eval_worker.cli import main\nassert main(['compare', {str(report)!r}]) == 0"
    assert heavy_modules_loaded(code) == []
