"""The target's sampling distribution p_T against transformers' own logits warpers (an independent
implementation of the same filters), and one seeded draw."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from cache_server.sampling import filtered_logits, sample_token, seeded_generator, target_probs
from schemas.sampling import SamplingParams


def _hf_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """transformers' warpers in vLLM's order: temperature, min-p, top-k, top-p."""
    x = TemperatureLogitsWarper(params.temperature)(None, logits.clone())  # type: ignore[arg-type]
    if params.min_p:
        x = MinPLogitsWarper(params.min_p)(None, x)  # type: ignore[arg-type]
    if params.top_k:
        x = TopKLogitsWarper(params.top_k)(None, x)  # type: ignore[arg-type]
    if params.top_p < 1:
        x = TopPLogitsWarper(params.top_p)(None, x)  # type: ignore[arg-type]
    return x.softmax(dim=-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=0),
        SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=0),
        SamplingParams(temperature=0.3, top_k=3, seed=0),
        SamplingParams(temperature=1.0, top_p=0.5, seed=0),
        SamplingParams(temperature=0.7, min_p=0.1, seed=0),
        SamplingParams(temperature=1.3, min_p=0.05, top_p=0.9, seed=0),
    ],
    ids=lambda p: p.setting,
)
def test_target_probs_equal_the_transformers_warpers(params: SamplingParams) -> None:
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 3
    ours, theirs = target_probs(logits, params), _hf_probs(logits, params)
    assert torch.equal(ours > 0, theirs > 0)  # the same support, token for token
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_greedy_is_the_argmax_and_filters_keep_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0]])
    assert target_probs(logits, SamplingParams()).tolist() == [[0.0, 1.0, 0.0, 0.0, 0.0]]
    top2 = filtered_logits(logits, SamplingParams(temperature=1.0, top_k=1, seed=0))
    assert torch.isfinite(top2).tolist() == [[False, True, True, False, False]]  # both tied with the first


def test_a_seed_draws_the_same_tokens_and_only_from_the_support() -> None:
    logits = torch.randn(512, generator=torch.Generator().manual_seed(1)) * 4
    params = SamplingParams(temperature=0.8, top_k=5, seed=3)

    def draws(seed: int) -> list[int]:
        generator = seeded_generator(seed, "cpu")
        return [sample_token(logits, params, generator) for _ in range(50)]

    assert draws(3) == draws(3) != draws(4)
    assert set(draws(3)) <= set(logits.topk(5).indices.tolist()) and len(set(draws(3))) > 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1)],
)
def test_out_of_range_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams.model_validate({"temperature": 1.0, "seed": 0, field: value})
