"""The target's sampling distribution p_T at a setting, from its logits, as vLLM's sampler builds it
(`vllm/v1/sample/sampler.py`: temperature, then min-p, then `apply_top_k_top_p` of
`vllm/v1/sample/ops/topk_topp_sampler.py`), and one seeded draw from it. The cache server samples
responses with it and checks their support; the eval worker's acceptance at T > 0 reads it."""

from __future__ import annotations

import torch
from torch import Tensor

from schemas.sampling import SamplingParams


def filtered_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> fp32 logits at temperature T with every filtered-out token at -inf.

    Greedy (T = 0) keeps only the argmax (ties: the lowest id, as `argmax` picks)."""
    x = logits.float()
    if params.greedy:
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.argmax(dim=-1, keepdim=True), True)
        return x.masked_fill(~keep, float("-inf"))
    x = x / params.temperature
    if params.min_p > 0:  # vLLM's MinPLogitsProcessor: relative to the most likely token, after temperature
        probs = x.softmax(dim=-1)
        x = x.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if params.top_k == 0 and params.top_p >= 1:
        return x
    ordered, order = x.sort(dim=-1, descending=False)  # ascending, as apply_top_k_top_p sorts
    if params.top_k:
        k = min(params.top_k, x.shape[-1])
        kth = ordered[..., x.shape[-1] - k, None]  # ties with the k-th largest stay in
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if params.top_p < 1:
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - params.top_p
        drop[..., -1] = False  # the most likely token always stays
        ordered = ordered.masked_fill(drop, float("-inf"))
    return ordered.scatter(-1, order, ordered)


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> p_T [..., V] in fp32: zero outside the filters' support (one-hot when greedy)."""
    return filtered_logits(logits, params).softmax(dim=-1)


def sample_token(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token drawn from p_T of logits [V] (the argmax when greedy), with `generator`'s stream."""
    if params.greedy:
        return int(logits.argmax())
    probs = target_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded with `seed`: the same seed gives the same stream on that device."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
