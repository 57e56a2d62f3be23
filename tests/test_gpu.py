"""CUDA checks, run where a GPU is present (skipped elsewhere): the default bf16 capture is exact
against a direct forward on the same device, and evaluation on the GPU scores what the CPU does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoConfig, AutoModelForCausalLM

from cache_server.api.app import create_app
from cache_server.client import HiddenResult, TargetHeads
from cache_server.settings import ServeSettings
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.evaluation.evaluate import evaluate
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.families.dflash.drafter import DFlashDrafter
from schemas.eval_spec import DFlashOptions
from schemas.hidden import HiddenMetadata
from schemas.model import ModelInfo
from testing.checkpoints import save_torch_checkpoint
from testing.tensors import as_numpy
from testing.tensors import parse_torch as parse
from testing.tiny_trainer import tiny_drafter_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
TOKENS = [5, 17, 300, 42, 9, 120, 77, 3, 250, 11, 64, 65, 66, 400, 401, 7, 8, 9, 10, 11]


def _served(client: TestClient, pid: str, layers: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    r = client.get("/hidden", params={"prompt_id": pid, "layers": layers})
    assert r.status_code == 200, r.text
    return parse(bytearray(r.content))


def test_bf16_capture_on_cuda_equals_a_direct_forward(tiny_target: Path, tmp_path: Path) -> None:
    settings = ServeSettings(model=tiny_target, store=tmp_path / "store", device="cuda")  # dtype: bf16 default
    with TestClient(create_app(settings)) as client:
        assert client.get("/model").json()["dtype"] == "bfloat16"
        pid = client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}]}).json()["prompts"][0]["prompt_id"]
        tensors, meta = _served(client, pid, "5,0,3")
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.bfloat16).cuda().eval()
    captured: dict[str, torch.Tensor] = {}
    model.model.layers[5].register_forward_hook(
        lambda _m, _i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o)
    )
    with torch.inference_mode():
        out = model(torch.tensor([TOKENS], device="cuda"), output_hidden_states=True)
    expected = torch.cat([captured["h"][0], out.hidden_states[1][0], out.hidden_states[4][0]], dim=1).cpu()
    assert meta["dtype"] == "bfloat16"
    assert torch.equal(tensors["hidden"], expected)


def test_device_map_auto_capture_equals_a_single_device_one(tiny_target: Path, tmp_path: Path) -> None:
    """`--device-map auto` spreads the target over the node's GPUs; the stored states are the bits a
    single-device server stores."""
    served = []
    for i, extra in enumerate(({"device": "cuda"}, {"device_map": "auto"})):
        settings = ServeSettings(model=tiny_target, store=tmp_path / f"store{i}", **extra)  # type: ignore[arg-type]
        with TestClient(create_app(settings)) as client:
            pid = client.post("/prompts", json={"prompts": [{"token_ids": TOKENS}]}).json()["prompts"][0]["prompt_id"]
            served.append(_served(client, pid, "0,1,2,3,4,5")[0]["hidden"])
    assert torch.equal(served[0], served[1])


class _Source:
    def __init__(self, info: ModelInfo, ids: torch.Tensor, taps: torch.Tensor, heads: TargetHeads) -> None:
        self.info, self.ids, self.taps, self._heads = info, ids, taps, heads

    def model(self) -> ModelInfo:
        return self.info

    def hidden(self, prompt_id: str, layers: list[int]) -> HiddenResult:
        meta = HiddenMetadata(
            prompt_id=prompt_id,
            layers=list(layers),
            layer_convention="decoder_output_0based",
            model_fingerprint=self.info.fingerprint,
            hidden_size=self.info.hidden_size,
            prompt_len=4,
            start=0,
            stop=len(self.ids),
            dtype="float32",
        )
        return HiddenResult(as_numpy(self.taps), as_numpy(self.ids), meta)

    def heads(self) -> TargetHeads:
        return self._heads


def test_evaluation_on_cuda_scores_what_the_cpu_does(tiny_target: Path, tmp_path: Path) -> None:
    cfg = AutoConfig.from_pretrained(tiny_target)
    info = ModelInfo(
        name="tiny",
        fingerprint="fp",
        num_layers=6,
        hidden_size=64,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=4096,
        dtype="float32",
        capture_layers=list(range(6)),
    )
    torch.manual_seed(0)
    ckpt = save_torch_checkpoint(
        tmp_path / "c.pt", DFlashDrafter(tiny_drafter_config(cfg, [1, 3, 5]), 3), global_step=1, epoch=0
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    embed, lm_head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    heads = TargetHeads(as_numpy(embed), as_numpy(lm_head), "fp")
    ids = torch.randint(0, 500, (64,))
    source = _Source(info, ids, torch.randn(64, 3 * 64), heads)
    runs = [("cpu", torch.float32), ("cuda", torch.float32), ("cuda", torch.bfloat16)]
    reports = [
        evaluate(
            source,
            load_checkpoint(ckpt, info, LoadRequest(options=DFlashOptions(tree_budgets=[4]))),
            ["p"],
            heads_cache=HeadsCache(tmp_path / f"{d}-{dtype}"),
            options=EvalOptions(device=d, dtype=dtype, progress=False),
        )
        for d, dtype in runs
    ]
    assert reports[0].prompts[0].chain == reports[1].prompts[0].chain  # fp32 is exact on either device
    assert reports[1].device == "cuda" and reports[2].dtype == "bfloat16"
    # bf16 (the default on a GPU, as engines run drafters) is not exact: report how often its walk agrees.
    fp32, bf16 = (_rounds(r.prompts[0].prompt_len, r.prompts[0].chain.round_taus) for r in reports[1:])
    agree = len(fp32 & bf16) / len(fp32)  # rounds at the same anchor with the same tau
    print(f"bf16 vs fp32 drafter on CUDA: {agree:.1%} of {len(fp32)} chain rounds agree")
    assert agree >= 0.5


def _rounds(prompt_len: int, taus: list[int]) -> set[tuple[int, int]]:
    """(anchor, tau) of every round of a walk."""
    out, s = set(), prompt_len
    for tau in taus:
        out.add((s, tau))
        s += tau
    return out
