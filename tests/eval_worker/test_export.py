"""`eval-worker export` against a real server: the `.ckpt` files hold what a direct transformers forward
computes (an FP8 store's dequantized), SpecForge's own offline loader reads them in the set's order (and
its DFlash step trains on them, on CPU), a rerun resumes without rewriting, and bad requests are refused
by name."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.cli import main
from eval_worker.exit_codes import ExitCode
from eval_worker.export import MANIFEST, ExportRequest, export
from eval_worker.settings import ConnectionSettings
from testing.peer_specforge import specforge_batches, specforge_dflash_steps
from testing.servers import running_server

PROMPTS = [[5 + i, 17, 3 + 2 * i, 99, 40 + i] for i in range(4)]
NEW_TOKENS = 6
AUX = [1, 3, 4]  # decoder outputs (SpecForge's numbering) of a 6-layer target


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("export")
    target = build_tiny_model(tmp / "target", layers=6, hidden=64)
    with running_server(target, tmp / "store") as url, CacheClient(url) as client:
        specs = [{"token_ids": p, "sets": ["train"]} for p in PROMPTS]
        client.wait_ready([r.prompt_id for r in client.register(specs, max_new_tokens=NEW_TOKENS)])
        yield url, target


@pytest.fixture(scope="module")
def forward(served: tuple[str, Path]) -> dict[str, list[torch.Tensor]]:
    """Per prompt, in registration order: token ids, HF hidden_states (index k + 1 = decoder output k)."""
    url, target = served
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with CacheClient(url) as client:
        ids = [client.hidden(p.prompt_id, [0]).token_ids for p in client.prompts(set_name="train")]
    tokens = [torch.as_tensor(i) for i in ids]
    with torch.no_grad():
        states = [model(input_ids=t[None], output_hidden_states=True).hidden_states for t in tokens]
    return {"tokens": tokens, "aux": [torch.cat([s[k + 1][0] for k in AUX], -1) for s in states],
            "normed_last": [s[-1][0] for s in states]}  # fmt: skip


def _export(url: str, out: Path, fmt: str, *flags: str, layers: str = "1,3,4", set_name: str = "train") -> int:
    return main(["export", str(out), "--server", url, "--format", fmt, "--set", set_name, "--layers", layers, *flags])


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # float32: the server's batched capture is not bit-for-bit a direct forward
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def _files(out: Path) -> list[Path]:
    return sorted(out.glob("*.ckpt"))


def _response_mask(tokens: torch.Tensor) -> list[int]:
    return [0] * len(PROMPTS[0]) + [1] * (len(tokens) - len(PROMPTS[0]))


def test_a_format_that_is_no_specforge_file_is_refused_before_the_server_is_asked(tmp_path: Path) -> None:
    # no server listens on port 9: the request is refused before any connection
    settings = ConnectionSettings(server="http://127.0.0.1:9")
    for fmt in ("speculators", "eagle3"):
        request = ExportRequest(tmp_path / "out", fmt, "train", [1, 3, 4])  # type: ignore[arg-type]  # as a caller might
        with pytest.raises(ValueError, match=f"format '{fmt}' is not one of: specforge-eagle3, specforge-dflash"):
            export(request, settings)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_files_hold_a_direct_forward_in_the_sets_order(served: Any, forward: Any, tmp_path: Path) -> None:
    url, _ = served
    assert _export(url, tmp_path / "eagle3", "specforge-eagle3") == ExitCode.ok
    files = _files(tmp_path / "eagle3")
    assert len(files) == len(PROMPTS)
    for i, path in enumerate(files):
        saved = torch.load(path, weights_only=True, mmap=True)
        assert saved["input_ids"].tolist()[: len(PROMPTS[0])] == PROMPTS[i]  # sorted names: the set's order
        assert torch.equal(saved["input_ids"], forward["tokens"][i]) and saved["input_ids"].dtype == torch.int64
        assert saved["loss_mask"].dtype == torch.int64
        assert saved["loss_mask"].tolist() == _response_mask(saved["input_ids"])
        _close(saved["aux_hidden_state"], forward["aux"][i][None])
        _close(saved["hidden_state"], forward["normed_last"][i][None])
        for t in saved.values():  # each in storage of its own, not a view of everything fetched
            assert t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    # Hugging Face indices name the same layers one higher: the same files, byte for byte
    assert _export(url, tmp_path / "hf", "specforge-eagle3", "--layer-convention", "hf_index", layers="2,4,5") == 0
    assert [p.read_bytes() for p in _files(tmp_path / "hf")] == [p.read_bytes() for p in files]


@pytest.mark.slow
@pytest.mark.peers
def test_specforge_reads_both_formats_as_a_direct_forward(served: Any, forward: Any, tmp_path: Path) -> None:
    url, _ = served
    for fmt, algorithm in (("specforge-eagle3", "eagle3"), ("specforge-dflash", "dflash")):
        out = tmp_path / algorithm
        assert _export(url, out, fmt) == ExitCode.ok
        files, batches = specforge_batches(algorithm, out, tmp_path)
        assert files == [str(p.resolve()) for p in _files(out)]
        for i, tokens in enumerate(forward["tokens"]):
            assert torch.equal(batches[f"{i}.input_ids"], tokens[None])
            mask = _response_mask(tokens)
            if algorithm == "eagle3":  # its normalizer renames the keys and masks the last position
                assert batches[f"{i}.loss_mask"].tolist() == [[*mask[:-1], 0]]
                _close(batches[f"{i}.hidden_state"], forward["aux"][i][None])
                _close(batches[f"{i}.target"], forward["normed_last"][i][None])
            else:
                assert batches[f"{i}.loss_mask"].tolist() == [mask]
                _close(batches[f"{i}.hidden_states"], forward["aux"][i][None])


@pytest.mark.slow
@pytest.mark.peers
def test_specforge_trains_its_dflash_draft_on_the_files_on_cpu(served: Any, tmp_path: Path) -> None:
    url, target = served
    assert _export(url, tmp_path, "specforge-dflash") == ExitCode.ok
    steps = specforge_dflash_steps(target, tmp_path, AUX)
    assert len(steps["losses"]) == len(PROMPTS)
    assert all(math.isfinite(loss) and loss > 0 for loss in steps["losses"])
    assert steps["changed"] == steps["draft_tensors"]  # every draft weight stepped


@pytest.mark.slow
def test_a_rerun_resumes_rewriting_only_what_is_missing(
    served: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = served
    assert _export(url, tmp_path, "specforge-dflash") == ExitCode.ok
    assert f"{len(PROMPTS)} files written" in capsys.readouterr().out
    files = _files(tmp_path)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    assert _export(url, tmp_path, "specforge-dflash") == ExitCode.ok
    assert f"0 files written (0 bytes), {len(PROMPTS)} already complete" in capsys.readouterr().out
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before
    # a killed run's leftovers: one file gone, its half-written temporary file still there
    files[1].unlink()
    partial = files[1].with_name(f".{files[1].name}.partial")
    partial.write_bytes(b"half a file")
    assert _export(url, tmp_path, "specforge-dflash") == ExitCode.ok
    assert f"1 files written ({len(before[files[1]][0])} bytes), {len(PROMPTS) - 1} already complete" in (
        capsys.readouterr().out
    )
    assert files[1].read_bytes() == before[files[1]][0] and not partial.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MANIFEST, *(p.name for p in files)])


@pytest.mark.slow
def test_another_export_into_the_same_directory_is_refused(
    served: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = served
    with CacheClient(url) as client:
        client.wait_ready([r.prompt_id for r in client.register([{"token_ids": [9, 8, 7], "sets": ["grow"]}])])
    assert _export(url, tmp_path, "specforge-dflash", set_name="grow") == ExitCode.ok
    assert _export(url, tmp_path, "specforge-dflash", set_name="grow", layers="1,3") == ExitCode.usage
    assert "layers [1, 3, 4], this run asks for [1, 3]" in capsys.readouterr().err
    with CacheClient(url) as client:
        client.wait_ready([r.prompt_id for r in client.register([{"token_ids": [9, 8, 6], "sets": ["grow"]}])])
    assert _export(url, tmp_path, "specforge-dflash", set_name="grow") == ExitCode.usage
    assert "set 'grow' changed since" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "data_0.ckpt").write_bytes(b"")
    assert _export(url, other, "specforge-dflash") == ExitCode.usage
    assert "holds .ckpt files this export does not write (data_0.ckpt)" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_requests_are_refused_by_name(served: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = served
    refusals = {
        "no prompt set 'nope' on the server; its sets: ": {"set_name": "nope"},
        "layer ids [6] are outside the target's 0..5": {"layers": "1,3,6"},
        "specforge-eagle3 takes exactly 3 layers": {"layers": "1,3"},
    }
    for message, options in refusals.items():
        assert _export(url, tmp_path / "out", "specforge-eagle3", **options) == ExitCode.usage
        assert message in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert _export(url, tmp_path / "file", "specforge-dflash") == ExitCode.usage
    assert "is a file: export writes a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written for a refused request


@pytest.mark.slow
def test_an_fp8_store_is_exported_dequantized(served: Any, forward: Any, tmp_path: Path) -> None:
    _, target = served
    with running_server(target, tmp_path / "fp8-store", "--store-dtype", "float8_e4m3fn") as url:
        with CacheClient(url) as client:
            specs = [{"token_ids": p, "sets": ["train"]} for p in PROMPTS]
            ids = [r.prompt_id for r in client.register(specs, max_new_tokens=NEW_TOKENS)]
            client.wait_ready(ids)
            served_states = [torch.from_numpy(client.hidden(p, AUX).hidden) for p in ids]
        assert _export(url, tmp_path / "out", "specforge-dflash") == ExitCode.ok
    for path, dequantized, exact in zip(_files(tmp_path / "out"), served_states, forward["aux"], strict=True):
        saved = torch.load(path, weights_only=True)["hidden_states"][0]
        assert saved.dtype == torch.float32  # the target's dtype, not the stored FP8 bytes
        assert torch.equal(saved, dequantized)
        assert not torch.equal(saved, exact)  # FP8 rounding happened, within its error of a direct forward:
        # 2^-4 of each value, and 2^-10 of its row's scale (amax / 448; over all three layers, a looser bound)
        bound = exact.abs() * 2**-4 * 1.001 + exact.abs().amax(-1, keepdim=True) / 448 * 2**-10 * 1.01
        assert ((saved - exact).abs() <= bound).all()
