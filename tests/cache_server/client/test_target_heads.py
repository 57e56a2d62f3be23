"""`GET /target/heads` carries the final norm's kind to the client: zero-centred for Qwen3-Next, plain for
DeepSeek-V3, plain for a body from a server that predates kinds, and left out when the kind is unknown."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.numpy import save
from transformers import AutoModelForCausalLM

from cache_server.api.app import create_app
from cache_server.client import CacheClient, TargetHeads
from cache_server.client.results import as_tensor
from testing.mtp_targets import save_deepseek_v3_mtp, save_qwen3_next_mtp
from testing.servers import serving_app
from tests.cache_server.helpers import serve_settings


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("norms")
    return {
        "qwen3_next": save_qwen3_next_mtp(root / "qwen3_next", linear_attention=False),
        "deepseek_v3": save_deepseek_v3_mtp(root / "deepseek_v3"),
    }


@pytest.mark.parametrize(("kind", "zero_centered"), [("qwen3_next", True), ("deepseek_v3", False)])
def test_the_final_norm_and_its_kind_round_trip_through_the_client(
    mtp_targets: dict[str, Path], tmp_path: Path, kind: str, zero_centered: bool
) -> None:
    app = create_app(serve_settings(mtp_targets[kind], tmp_path / "store", dtype="bfloat16"))
    with serving_app(app) as url, CacheClient(url) as client:
        heads = client.heads()
    norm = AutoModelForCausalLM.from_pretrained(mtp_targets[kind], dtype=torch.bfloat16).model.norm
    assert heads.final_norm is not None and heads.final_norm_zero_centered == zero_centered
    assert torch.equal(as_tensor(heads.final_norm), norm.weight.detach())
    assert heads.final_norm_eps == (norm.eps if zero_centered else norm.variance_epsilon)


def _heads_body(meta: dict[str, str]) -> bytes:
    tensors = {name: np.ones((4, 2), np.float32) for name in ("embed_tokens.weight", "lm_head.weight")}
    return save({**tensors, "norm.weight": np.full(2, 0.5, np.float32)}, metadata={"model_fingerprint": "f", **meta})


def _served(body: bytes) -> TargetHeads:
    response = httpx.Response(200, stream=httpx.ByteStream(body), headers={"Content-Length": str(len(body))})
    with CacheClient("http://test", transport=httpx.MockTransport(lambda _: response)) as client:
        return client.heads()


def test_a_body_without_a_norm_kind_reads_as_plain() -> None:
    """Servers that predate kinds served plain RMSNorms only."""
    heads = _served(_heads_body({"final_norm_eps": "1e-06"}))
    assert heads.final_norm is not None and heads.final_norm_eps == 1e-6 and not heads.final_norm_zero_centered


def test_a_norm_of_an_unknown_kind_is_left_out() -> None:
    heads = _served(_heads_body({"final_norm_eps": "1e-06", "final_norm_kind": "layernorm"}))
    assert heads.final_norm is None and heads.final_norm_eps is None
    assert heads.lm_head.shape == (4, 2)
