"""An FP8 store end to end: a real `cache-server serve --store-dtype float8_e4m3fn` and `eval-worker
evaluate`, within FP8's error of an in-process forward, and bit for bit what an independent quantizer
makes of the states an exact server captured the same way (what is determined bit for bit)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from cache_server.capture.fingerprint import target_fingerprint
from cache_server.client import CacheClient, HiddenResult
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.cli import main
from eval_worker.evaluation.evaluate import evaluate
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.eval_spec import DFlashOptions
from schemas.model import ModelInfo
from schemas.report import EvalReport
from testing.checkpoints import save_torch_checkpoint
from testing.servers import running_server
from testing.tiny_trainer import Sequences
from tests.eval_worker.evaluation.test_evaluate import TinySource

pytestmark = pytest.mark.slow
FP8 = "float8_e4m3fn per-token scale"


def fp8_round_trip(x: np.ndarray) -> np.ndarray:
    """float32 [T, H] as an FP8 store keeps it, by ml_dtypes rather than the server's torch code."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    q = np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return (q.astype(np.float32) * scale).astype(np.float32)


def fp8_round_trip_layers(x: np.ndarray, h: int) -> np.ndarray:
    """Each [T, H] layer of x [T, K*H] through `fp8_round_trip`."""
    return np.concatenate([fp8_round_trip(x[:, i * h : (i + 1) * h]) for i in range(x.shape[1] // h)], axis=1)


class Fp8Source(TinySource):
    """The tiny target's forward, each layer quantized to FP8 with per-token scales."""

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        exact = super().hidden(prompt_id, layers)
        return HiddenResult(fp8_round_trip_layers(exact.hidden, self.info.hidden_size), exact.token_ids, exact.metadata)


@pytest.fixture(scope="module")
def fp8_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, sequences: Sequences
) -> Iterator[tuple[str, list[str]]]:
    """The server's URL and its prompt ids, in the order of `sequences` (the ground truth's p0, p1, ...)."""
    store = tmp_path_factory.mktemp("fp8") / "store"
    one_at_a_time = ("--batch-tokens", "1")  # each sequence its own unpadded forward: see exact_values
    fp8 = running_server(tiny_target, store, "--store-dtype", "float8_e4m3fn", *one_at_a_time)
    with fp8 as url, CacheClient(url) as client:
        specs = sequences.prompt_specs()
        ids = [p.prompt_id for p in client.register(specs)]
        client.wait_ready(ids, timeout_s=60)
        yield url, ids


def test_the_fp8_server_says_what_it_serves_and_stays_within_fp8s_error(
    fp8_server: tuple[str, list[str]],
    tiny_target: Path,
    target: Any,
    target_info: ModelInfo,
    sequences: Sequences,
    tmp_path: Path,
) -> None:
    url, ids = fp8_server
    with CacheClient(url) as client:
        info = client.model()
        assert info.storage == "float8_e4m3fn"
        assert info.fingerprint == target_fingerprint(tiny_target, "float32", "float8_e4m3fn")
        assert info.fingerprint != target_fingerprint(tiny_target, "float32")  # never an exact store's
        layers = [1, 3, 5]
        both = [client.hidden(ids[0], layers, encoding=e) for e in ("safetensors", "pieces")]
    assert both[0].metadata.storage == both[1].metadata.storage == FP8
    assert both[0].hidden.tobytes() == both[1].hidden.tobytes()
    truth = TinySource(target, target_info, sequences).hidden("p0", layers).hidden
    assert both[0].hidden.shape == truth.shape
    h = target_info.hidden_size
    for i in range(len(layers)):
        x, y = truth[:, i * h : (i + 1) * h], both[0].hidden[:, i * h : (i + 1) * h]
        scale = np.abs(x).max(axis=1, keepdims=True) / 448
        assert (np.abs(x - y) <= np.abs(x) * 2**-4 * 1.001 + scale * 2**-10 * 1.01).all()
    exact = exact_values(tiny_target, sequences.prompt_specs()[0], layers, tmp_path)
    np.testing.assert_array_equal(both[0].hidden, fp8_round_trip_layers(exact, h))  # the independent quantizer


def exact_values(model: Path, spec: dict[str, Any], layers: list[int], tmp_path: Path) -> np.ndarray:
    """The layers an exact store keeps of `spec`, captured as the FP8 server captured them: another server
    process of the same code, each sequence its own forward. What the FP8 store quantized is these bits;
    the test's own forward (another process, another thread count) may differ from them in the last bit."""
    with running_server(model, tmp_path / "exact", "--batch-tokens", "1") as url, CacheClient(url) as client:
        [prompt] = client.register([spec])
        client.wait_ready([prompt.prompt_id], timeout_s=60)
        return client.hidden(prompt.prompt_id, layers).hidden


def test_evaluate_on_fp8_features_reports_their_storage_and_matches_the_ground_truth(
    fp8_server: tuple[str, list[str]],
    trained_drafter: DFlashDrafter,
    target: Any,
    target_info: ModelInfo,
    sequences: Sequences,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ckpt = save_torch_checkpoint(tmp_path / "step_7.pt", trained_drafter, global_step=7, epoch=1)
    monkeypatch.setenv("EVAL_WORKER_HEADS_CACHE", str(tmp_path / "heads"))
    out = tmp_path / "report.json"
    argv = ["evaluate", str(ckpt), "--server", fp8_server[0], "--all-prompts", "--tree-budget", "3", "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    report = EvalReport.model_validate_json(out.read_text())
    assert report.feature_storage == FP8
    assert f"features stored {FP8}" in capsys.readouterr().out

    truth = evaluate(
        Fp8Source(target, target_info, sequences),
        load_checkpoint(ckpt, target_info, LoadRequest(options=DFlashOptions(tree_budgets=[3]))),
        [f"p{i}" for i in range(len(sequences.token_ids))],
        heads_cache=HeadsCache(tmp_path / "truth-heads"),
        options=EvalOptions(progress=False),
    )
    served = {p.prompt_id: p for p in report.prompts}
    for pid, expected in zip(fp8_server[1], truth.prompts, strict=True):
        assert (served[pid].chain, served[pid].trees) == (expected.chain, expected.trees)
