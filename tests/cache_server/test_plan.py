"""A plan before the bytes: what `cache-server plan` and `GET /plan` project, against what a capture
then writes, and a registration a local store has no room for refused before anything is written."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_server.cli import main
from testing.imports import heavy_modules_loaded
from tests.cache_server.helpers import app_client, error_message, register_ready


def _prompts(n: int, length: int, offset: int) -> list[dict[str, list[int]]]:
    """`n` prompts of exactly `length` tokens each (half prompt, half given response)."""
    half = length // 2
    return [
        {
            "token_ids": [(offset + i * 7 + j) % 500 + 3 for j in range(half)],
            "response_token_ids": [(offset + i * 11 + j) % 500 + 3 for j in range(length - half)],
        }
        for i in range(n)
    ]


def _stored_layer_bytes(store: Path, prompt_ids: list[str]) -> int:
    """Every byte of the prompts' layers (and an FP8 store's scales): not their token ids or manifests."""
    arrays = ("layers", "scales")
    return sum(
        f.stat().st_size
        for pid in prompt_ids
        for kind in arrays
        for f in store.rglob(f"prompts/{pid}/{kind}/*/**/*")
        if f.is_file()
    )


@pytest.mark.parametrize(("store_dtype", "per_token"), [("exact", 64 * 4), ("float8_e4m3fn", 64 + 4)])
def test_the_plan_is_within_ten_percent_of_what_the_capture_then_writes(
    tiny_target: Path, tmp_path: Path, store_dtype: str, per_token: int
) -> None:
    store = tmp_path / "store"
    with app_client(tiny_target, store, store_dtype=store_dtype) as client:
        empty = client.get("/plan", params={"prompts": 10, "tokens": 200}).json()
        assert empty["codec_ratio_source"].startswith("documented")
        register_ready(client, _prompts(4, 200, offset=0))  # the target's own activations, to measure on
        plan = client.get("/plan", params={"prompts": 10, "tokens": 200}).json()
        assert plan["codec_ratio_source"] == "measured on 4 stored prompts of this target"
        ids = register_ready(client, _prompts(10, 200, offset=1000))
    written = _stored_layer_bytes(store, ids)
    assert plan["bytes_per_token_per_layer"] == per_token  # H=64, float32 on CPU; FP8: a byte each and a scale
    assert plan["storage"] == store_dtype
    assert plan["tokens"] == 10 * 200 and plan["capture_layers"] == list(range(6))
    assert abs(plan["capture_layers_bytes"] - written) <= 0.1 * written, (plan["capture_layers_bytes"], written)
    print(f"projected {plan['capture_layers_bytes']} bytes, written {written} (ratio {plan['codec_ratio']:.3f})")


def test_the_offline_plan_reads_the_config_alone(tiny_target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((tiny_target / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    argv = ["plan", "--model", str(tiny_target), "--prompts", "1000", "--tokens", "2500", "--capture-layers", "1,3"]
    assert main(argv) == 0
    lines = {line[:19].strip(): line[19:] for line in capsys.readouterr().out.splitlines()}
    per_token = hidden * 2  # bf16, what a GPU server stores
    assert lines["per token"].startswith(f"{per_token} B per layer")
    assert lines["all layers"].endswith(f"({math.ceil(1000 * 2500 * per_token * layers / 1.45)} bytes)")
    assert lines["capture layers"].endswith(f"({math.ceil(1000 * 2500 * per_token * 2 / 1.45)} bytes, 2 layers)")
    assert lines["free space"].startswith("not known")

    assert main([*argv, "--store-dtype", "float8_e4m3fn"]) == 0
    lines = {line[:19].strip(): line[19:] for line in capsys.readouterr().out.splitlines()}
    assert lines["target"].endswith("stored as float8_e4m3fn + per-token scales")
    assert lines["per token"].startswith(f"{hidden + 4} B per layer")
    assert lines["all layers"].endswith(f"({math.ceil(1000 * 2500 * (hidden + 4) * layers / 1.16)} bytes)")


def test_a_wrong_model_path_is_the_one_line_serve_gives_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong-path"
    argv = ["plan", "--model", str(wrong), "--prompts", "10", "--tokens", "100"]
    assert main(argv) == 2
    assert (
        capsys.readouterr().err
        == f"cache-server: --model {wrong} is not a Hugging Face model directory (no config.json)\n"
    )
    # refused before transformers is imported: nothing asks the model hub
    assert heavy_modules_loaded(f"from cache_server.cli import main\nassert main({argv!r}) == 2") == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB file system (tmpfs): a local store that fills up."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_registration_past_the_free_space_is_refused_before_anything_is_written(
    tiny_target: Path, small_disk: Path
) -> None:
    store = small_disk / "store"
    with app_client(tiny_target, store, capture_layers="0,5") as client:
        # 2 layers x 256 B per token / 1.45 = 353 B per token: 3,000 tokens need ~1 MB, more than is free
        big = client.post("/prompts", json={"prompts": _prompts(15, 200, offset=0)})
        message = error_message(big, 422, "storage_exceeded")
        assert "15 new prompts of up to 3000 tokens" in message and "bytes free" in message
        assert client.get("/prompts").json()["total"] == 0  # nothing registered
        assert not list(store.rglob("prompts/*/layers"))  # nothing written
        register_ready(client, _prompts(2, 200, offset=0))  # what fits is registered and captured
        assert client.get("/prompts").json()["total"] == 2
