"""The demo's main path (smaller): real server, trained checkpoints of the three families, jobs, worker,
leaderboard, plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import demo.__main__ as demo
from demo.__main__ import main
from eval_worker.cli import main as eval_worker_main
from schemas.parity import ParityReport
from testing.engine import VllmServer
from testing.servers import free_port, running_server

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workdir", str(tmp_path / "demo"), "--layers", "8", "--new-tokens", "16", "--steps", "5", "40"]) == 0
    out = capsys.readouterr().out
    board = out[out.index("leaderboard") :].splitlines()
    rows = {(r[0], r[1]): r for line in board if (r := line.split()) and r[0] in {"5", "40"}}
    assert sorted(rows) == [("40", "dflash:"), ("40", "eagle3:"), ("40", "mtp:"), ("5", "dflash:")]  # one each
    table = board[1 : next(i for i, line in enumerate(board) if line.startswith("±:")) + 1]
    assert max(map(len, table)) <= 120
    assert board[1].split() == ["T=0", "T=0.6", "top_p=0.95"]  # each setting apart, T = 0 first
    for row in rows.values():  # per setting: prompts, per-prompt tau ± s.e., pooled tau; both count the bonus token
        for n, per_prompt, pooled in (row[-6:-3], row[-3:]):
            assert int(n) > 0 and float(per_prompt.split("±")[0]) >= 1.0 and float(pooled) >= 1.0
    # DFlash formula for 3 taps of 8 layers; EAGLE-3 defaults, layer inputs (2, 4, 5); MTP the last layer
    layers = {"dflash": [1, 3, 5], "eagle3": [1, 3, 4], "mtp": [7]}
    board_json = json.loads((tmp_path / "demo" / "leaderboard.json").read_text())
    assert {r["drafter_family"]: r["target_layer_ids"] for r in board_json["reports"]} == layers
    assert (tmp_path / "demo" / "tau.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "thesis.tex").write_text("not the demo's")
    with pytest.raises(SystemExit) as e:
        main(["--workdir", str(precious)])
    assert e.value.code == 2 and (precious / "thesis.tex").read_text() == "not the demo's"


def test_without_chromium_the_screenshot_is_refused_when_asked_and_said_skipped_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "CHROMIUM", None)
    with pytest.raises(SystemExit) as e:  # before any work: nothing built
        main(["--workdir", str(tmp_path / "demo"), "--screenshot"])
    assert e.value.code == 2 and not (tmp_path / "demo").exists()
    assert (
        "--screenshot: Chromium is not installed (Debian/Ubuntu: apt-get install chromium)" in capsys.readouterr().err
    )
    demo._screenshot("http://127.0.0.1:9", tmp_path / "page.png", None)
    said = capsys.readouterr().out
    assert "page screenshot: SKIPPED, Chromium is not installed" in said and "apt-get install chromium" in said
    demo._screenshot("http://127.0.0.1:9", tmp_path / "page.png", False)
    assert capsys.readouterr().out == "page screenshot: skipped (--no-screenshot)\n"


@pytest.mark.engine
def test_vllm_serves_the_demos_checkpoints_as_saved_and_agrees(tmp_path: Path) -> None:
    """The demo's HF checkpoints, given to vLLM as they are, serve at the offline rounds (parity exit 0)."""
    workdir = tmp_path / "demo"
    assert main(["--workdir", str(workdir), "--layers", "8", "--new-tokens", "16", "--steps", "5", "40"]) == 0
    with running_server(workdir / "target", workdir / "store") as server:
        for method, checkpoint, k in [("dflash", "dflash_step_40", 3), ("eagle3", "eagle3_step_40", 4)]:
            served = workdir / "runs" / checkpoint
            spec = json.dumps({"method": method, "model": str(served), "num_speculative_tokens": k})
            engine = VllmServer(
                workdir / "target", free_port(), tmp_path / f"vllm-{method}.log", "--speculative-config", spec
            )
            engine.start()
            try:
                out = tmp_path / f"{method}.json"
                argv = ["parity", str(served), "--engine", engine.url, "--server", server, "--out", str(out)]
                assert eval_worker_main([*argv, "--device", "cpu"]) == 0, method
            finally:
                engine.stop()
            report = ParityReport.model_validate_json(out.read_text())
            assert (report.drafter_family, report.speculative_tokens, report.agreeing) == (method, k, 8)
