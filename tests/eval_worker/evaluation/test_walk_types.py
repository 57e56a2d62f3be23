"""The target's final norm as the worker gets it from the cache (`TargetNorm`, through a served body) is
transformers' own, bit for bit, for a zero-centred norm (Qwen3-Next) and a plain one (DeepSeek-V3), in
fp32 and bf16, on the last layer the cache serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.api.app import create_app
from cache_server.client import CacheClient
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.probabilistic import target_logits
from eval_worker.evaluation.walk_types import DeviceHeads, TargetNorm
from testing.mtp_targets import save_deepseek_v3_mtp, save_qwen3_next_mtp
from testing.servers import serving_app
from tests.cache_server.helpers import serve_settings

PROMPT = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11]


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("norms")
    return {
        "qwen3_next": save_qwen3_next_mtp(root / "qwen3_next", linear_attention=False),
        "deepseek_v3": save_deepseek_v3_mtp(root / "deepseek_v3"),
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("kind", "zero_centered"), [("qwen3_next", True), ("deepseek_v3", False)])
def test_the_served_final_norm_is_the_models_bit_for_bit(
    mtp_targets: dict[str, Path], tmp_path: Path, kind: str, zero_centered: bool, dtype: str
) -> None:
    app = create_app(serve_settings(mtp_targets[kind], tmp_path / "store", dtype=dtype))
    with serving_app(app) as url, CacheClient(url) as client:
        (registered,) = client.register([{"token_ids": PROMPT}])
        client.wait_ready([registered.prompt_id], timeout_s=60)
        last, _ = client.hidden(registered.prompt_id, [client.model().num_layers - 1]).to_torch()  # [T, H] raw
        served = client.heads()
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(mtp_targets[kind], dtype=torch_dtype).eval()
    heads = DeviceHeads.of(served, EvalOptions(dtype=torch_dtype, draft_sampling="probabilistic", progress=False))
    norm = heads.norm()
    assert norm.zero_centered == zero_centered and last.dtype == torch_dtype
    with torch.inference_mode():
        normed = model.model.norm(last)
        logits = model.lm_head(normed).float()
    assert torch.equal(norm(last), normed)
    assert torch.equal(target_logits(last, heads.lm_head, norm), logits)
    wrong = TargetNorm(norm.weight, norm.eps, not zero_centered)  # the other formula is told apart
    assert not torch.equal(wrong(last), normed)


def test_a_zero_centered_norm_scales_by_one_plus_its_weight() -> None:
    norm = TargetNorm(torch.tensor([0.5, -0.25], dtype=torch.bfloat16), 1e-6, zero_centered=True)
    moved = norm.to("cpu", torch.float32)
    assert moved.weight.dtype == torch.float32 and moved.eps == 1e-6 and moved.zero_centered
    x = torch.tensor([[3.0, 4.0]])
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.tensor([1.5, 0.75])
    assert torch.equal(moved(x), expected)
