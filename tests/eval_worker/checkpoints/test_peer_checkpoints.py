"""Checkpoints the peers' own libraries write (speculators 0.9, SpecForge 0.2, run from their environment)
load with the right family, layout and served layers; speculators' own forward is the ground truth for
how its EAGLE-3 drafter is read, sliding window included; a DFlash config without a mask token names
the flag that supplies it; and the speculators checkpoint evaluates through a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.cli import main
from eval_worker.errors import CheckpointRefused
from eval_worker.exit_codes import ExitCode
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from schemas.eval_spec import DFlashOptions
from schemas.model import ModelInfo
from schemas.report import Eagle3Drafting, EvalReport
from testing.peers import peers_python, speculators_drafts, write_peer_checkpoints
from testing.servers import running_server

pytestmark = pytest.mark.peers

LAYERS = 8  # speculators' default aux ids [2, 4, 5] are layer inputs = decoder outputs [1, 3, 4]
TARGET = ModelInfo(
    name="tiny8",
    fingerprint="fp8",
    num_layers=LAYERS,
    hidden_size=128,
    vocab_size=512,
    max_position_embeddings=4096,
    dtype="float32",
    capture_layers=[],
)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("target"), layers=LAYERS, hidden=128, head_dim=32, seed=0)


@pytest.fixture(scope="module")
def written(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if peers_python() is None:
        pytest.fail("the peers' environment .venv-peers is missing: ./dev test (or .ci/run) builds it")
    return write_peer_checkpoints(target_dir, tmp_path_factory.mktemp("peers"))


# name: (family, layout, served layers, what else the file says)
EXPECTED = {
    "speculators_eagle3": ("eagle3", "speculators", (1, 3, 4), {"sliding_window": 2048, "speculative_tokens": 3}),
    "speculators_eagle3_window65": ("eagle3", "speculators", (1, 3, 4), {"sliding_window": 65}),
    "specforge_dflash": ("dflash", "dflash", (1, 5), {"block_size": 16, "mask_token_id": 3}),
    "specforge_eagle3": ("eagle3", "eagle", (1, 3, 4), {"draft_vocab_size": 256, "sliding_window": None}),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_peer_checkpoints_load_as_their_writers_mean_them(written: dict[str, Path], name: str) -> None:
    family, layout, layers, fields = EXPECTED[name]
    loaded = load_checkpoint(written[name], TARGET)
    assert (loaded.family, loaded.layout, loaded.target_layer_ids) == (family, layout, layers)
    assert {k: getattr(loaded.config, k) for k in fields} == fields
    saved = load_file(written[name] / "model.safetensors")
    mine = loaded.drafter.state_dict()
    prefix = "layers.0." if loaded.layout == "speculators" else "midlayer."
    for key, tensor in saved.items():  # every tensor as written; t2d only restates d2t, which it must agree with
        ours = "midlayer." + key.removeprefix(prefix) if key.startswith(prefix) else key
        assert key == "t2d" or torch.equal(mine[ours], tensor), key


@pytest.mark.parametrize("name", ["speculators_eagle3", "speculators_eagle3_window65"])
def test_first_drafts_equal_speculators_own_forward(written: dict[str, Path], tmp_path: Path, name: str) -> None:
    """150 positions: past the window of 65, so reading it as full attention would differ."""
    torch.manual_seed(1)
    taps, ids = torch.randn(151, 3 * 128), torch.randint(0, 512, (151,))
    truth = speculators_drafts(written[name], taps, ids, tmp_path)
    drafter = load_checkpoint(written[name], TARGET).drafter
    assert isinstance(drafter, Eagle3Drafter)
    with torch.no_grad():
        roots = drafter.prefill(taps, ids, drafter.embed_tokens.weight).roots
        assert torch.equal(drafter.logits(roots).argmax(-1), truth)


def test_a_dflash_config_without_a_mask_token_names_the_flag(
    written: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = written["specforge_dflash_no_mask"]
    with pytest.raises(CheckpointRefused, match=r"names no mask_token_id.*pass --mask-token-id"):
        load_checkpoint(path, TARGET)
    mask = LoadRequest(options=DFlashOptions(mask_token_id=3))
    assert load_checkpoint(path, TARGET, mask).config.mask_token_id == 3  # type: ignore[union-attr]
    with pytest.raises(CheckpointRefused, match="--mask-token-id 4 contradicts the config's mask_token_id 3"):
        load_checkpoint(written["specforge_dflash"], TARGET, LoadRequest(options=DFlashOptions(mask_token_id=4)))
    assert main(["inspect", str(path)]) == ExitCode.refused
    assert "--mask-token-id" in capsys.readouterr().err
    assert main(["inspect", str(path), "--mask-token-id", "3"]) == 0
    assert "mask token         3" in capsys.readouterr().out


@pytest.fixture(scope="module")
def served(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(target_dir, tmp_path_factory.mktemp("store")) as url, CacheClient(url) as client:
        specs = [{"text": t} for t in ("def fib(n):", "The quick brown fox", "Speculative decoding drafts")]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=24)])
        yield url


@pytest.mark.slow
def test_the_speculators_checkpoint_evaluates_through_a_real_server(
    written: dict[str, Path], served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    out = tmp_path / "report.json"
    argv = ["evaluate", str(written["speculators_eagle3"]), "--server", served, "--all-prompts", "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    report = EvalReport.model_validate_json(out.read_text())
    assert (report.drafter_family, report.layout) == ("eagle3", "speculators")
    assert isinstance(report.drafting, Eagle3Drafting) and report.drafting.steps == 3
    assert (report.target_layer_ids, report.checkpoint_layer_ids) == ([1, 3, 4], [2, 4, 5])
    assert len(report.prompts) == 3 and report.summary.chain.mean_tau is not None
    assert report.summary.chain.mean_tau >= 1.0
