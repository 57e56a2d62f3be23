"""MTP heads walked offline against an independent live greedy loop (`testing/mtp_reference.py`, written
from vLLM's MTP model files with nothing of `eval_worker`): the rounds of every prompt equal, for both
layouts and chains of 1 to 4 drafts, loaded from the target's own directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.raw import read_raw
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads, DraftCost, PromptFeatures, TargetNorm
from eval_worker.families import FAMILIES, family_of
from schemas.eval_spec import MtpOptions
from schemas.model import ModelInfo
from testing.mtp_reference import MtpReference
from testing.mtp_targets import Tuning, save_deepseek_v3_mtp, save_qwen3_5_mtp, save_qwen3_next_mtp

PROMPTS = [[5, 17, 3, 99, 250], [1, 2, 3], [400, 7, 7, 7, 31, 8, 2]]
NEW_TOKENS = 24
TUNING = Tuning(0.1, 6.0, 3.0)  # drafts accepted often enough that every position counts


def _target(kind: str, root: Path) -> Path:
    if kind == "deepseek":
        return save_deepseek_v3_mtp(root / kind, tuning=TUNING)
    if kind == "qwen3_next":
        return save_qwen3_next_mtp(root / kind, linear_attention=False, tuning=TUNING)
    return save_qwen3_5_mtp(root / kind, moe=kind == "qwen3_5_moe", linear_attention=False, tuning=TUNING)


@pytest.fixture(scope="module", params=["deepseek", "qwen3_next", "qwen3_5", "qwen3_5_moe"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _target(request.param, tmp_path_factory.mktemp("mtp"))


def _info(model: torch.nn.Module, name: str) -> ModelInfo:
    cfg = model.config
    return ModelInfo(
        name=name,
        fingerprint="f",
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        dtype="float32",
        capture_layers=list(range(cfg.num_hidden_layers)),
    )


def _features(model: torch.nn.Module, tokens: list[int], prompt_len: int) -> PromptFeatures:
    """The target's raw last-layer output (this project's layer L-1), by a hook on the last decoder layer."""
    seen: list[torch.Tensor] = []
    hook = model.model.layers[-1].register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    hook.remove()
    raw = seen[0][0] if isinstance(seen[0], torch.Tensor) else seen[0][0][0]
    return PromptFeatures(raw, tokens, prompt_len)


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_rounds_equal_the_live_loop(target: Path, steps: int) -> None:
    reference = MtpReference(target)
    model = reference.target
    raw = read_raw(target)
    family = family_of(raw.config)
    assert family.name == "mtp"
    loaded = family.load(target, raw, _info(model, target.name), LoadRequest(options=MtpOptions(steps=steps)))
    norm = model.model.norm
    zero_centered = loaded.layout != "deepseek"  # (1 + w) * x, as the Qwen norms compute it
    eps = float(norm.eps if zero_centered else norm.variance_epsilon)
    heads = DeviceHeads(
        model.model.embed_tokens.weight.detach(),
        model.lm_head.weight.detach(),
        TargetNorm(norm.weight.detach(), eps, zero_centered=zero_centered),
    )
    runs = [reference.run(p, NEW_TOKENS, steps) for p in PROMPTS]
    prompts = [_features(model, p + run.tokens, len(p)) for p, run in zip(PROMPTS, runs, strict=True)]
    walked = FAMILIES["mtp"].walk(loaded, prompts, heads, EvalOptions(progress=False), DraftCost())
    for run, rounds in zip(runs, walked, strict=True):
        assert rounds.chain == run.round_taus()  # accepted drafts + the bonus token, per round
    assert any(a > 0 for run in runs for a in run.accepted)  # the heads are accepted: the test can fail
