"""Is an engine's speculative sampling lossless? Asked before parity at T > 0, whose exactness rests on it.

Lossless speculative sampling outputs tokens distributed exactly as the target's own sampling (REFERENCE
s.15). The probe sends a few cached prompts at a tiny temperature (top-p, top-k and min-p off, with a
seed), registers each output path as a response sampled at that setting, and reads p_T at every output
position from the captured last layer through the target's final norm and lm_head. Each output token y
gets its tail: the target's total probability of the tokens no more likely than y, sum of p_T(x) over
p_T(x) <= p_T(y). Under a lossless sampler the tail is a p-value: P(tail < THRESHOLD) <= THRESHOLD at
every position, so over the probe's tokens (2 x 32 in the tests, up to 2 x 2048 on benchmark prompts) a
false alarm has probability below 1e-4 or 5e-3. An engine that verifies at the wrong temperature, or
serves another model, outputs such tokens within a few rounds. The probe judges by p_T, not by agreement
with the greedy path: where the target's two best logits are within ~T of each other, a lossless sampler
itself leaves the greedy path.

p_T comes from the cache's forward, not the engine's: at T = 1e-3 a logit difference d between the two
becomes 1000 d nats. fp32 forwards differ by ~1e-5 (harmless); a bf16 engine's logits differ from the
capture's by ~1e-2, so probe those at a larger temperature (`--probe-temperature 0.01`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cache_server.client import CacheClient
from cache_server.sampling import filtered_logits
from eval_worker.evaluation.probabilistic import LOGIT_ELEMENTS, target_logits
from eval_worker.evaluation.walk_types import TargetNorm
from eval_worker.parity.engine import VllmEngine
from eval_worker.parity.options import PROBE_TEMPERATURE
from eval_worker.parity.paths import register_path, split_tokens
from schemas.parity import ProbeVerdict
from schemas.sampling import SamplingParams

THRESHOLD = 1e-6


@dataclass(frozen=True)
class ProbeOptions:
    """How the probe samples: its temperature and the number of cached prompts it sends."""

    temperature: float = PROBE_TEMPERATURE
    prompts: int = 2
    threshold: float = THRESHOLD


@dataclass(frozen=True)
class _Token:
    """One output token of a path: the prompt it answers, its response position, id, log p_T and log tail."""

    source: str
    path: str
    position: int
    token_id: int
    log_p: float
    log_tail: float


def probe_engine(
    client: CacheClient,
    engine: VllmEngine,
    sources: Sequence[str],
    seed: int,
    options: ProbeOptions,
    timeout_s: float,
    device: torch.device,
) -> ProbeVerdict:
    """The verdict on the first `options.prompts` of `sources` (cached prompt ids), each sampled with `seed`;
    p_T computed on `device`."""
    params = SamplingParams(temperature=options.temperature, seed=seed)
    heads = client.heads()
    served = TargetNorm.served(heads)
    if served is None:
        return ProbeVerdict(
            lossless=None,
            reason="not probed: the server sends no final norm of the target (not an RMSNorm the cache serves)",
        )
    paths = {}
    for source in sources[: options.prompts]:
        prompt, response = split_tokens(client, source)
        output = engine.sample(prompt, len(response), params)
        paths[source] = register_path(client, prompt, output, params, engine.generator(), f"parity probe of {source}")
    client.wait_ready(list(paths.values()), timeout_s=timeout_s)
    lm_head = heads.to_torch()[1].to(device)
    norm = served.to(device, served.weight.dtype)
    last_layer = client.model().num_layers - 1
    judged = [
        token
        for source, path in paths.items()
        for token in _judged(client, source, path, last_layer, lm_head, norm, params)
    ]
    return _verdict(engine.url, options, judged)


def _judged(
    client: CacheClient,
    source: str,
    path: str,
    last_layer: int,
    lm_head: torch.Tensor,
    norm: TargetNorm,
    params: SamplingParams,
) -> list[_Token]:
    """Every output token of `path` with its log p_T and log tail at `params`, from the captured last layer."""
    hidden, token_ids = client.hidden(path, [last_layer]).to_torch()  # [T, H], [T]
    prompt_len = client.prompt(path).prompt_len
    output = token_ids[prompt_len:].long()  # [N]
    log_p, log_tail = log_tails(hidden[prompt_len - 1 : -1], output, lm_head, norm, params)  # row i: token i
    return [_Token(source, path, i, int(output[i]), float(log_p[i]), float(log_tail[i])) for i in range(len(output))]


def log_tails(
    rows: torch.Tensor,
    tokens: torch.Tensor,
    lm_head: torch.Tensor,
    norm: TargetNorm,
    params: SamplingParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-layer rows [N, H] and the token each one was followed by [N] -> (log p_T of that token, log of
    the summed p_T of the tokens no more likely), both fp32 [N] on the CPU; full-vocab logits in chunks."""
    per = max(1, LOGIT_ELEMENTS // lm_head.shape[0])
    chosen, tails = [], []
    for lo in range(0, len(tokens), per):
        logits = target_logits(rows[lo : lo + per].to(lm_head.device), lm_head, norm)  # [r, V]
        log_p = filtered_logits(logits, params).log_softmax(dim=-1)
        picked = log_p.gather(-1, tokens[lo : lo + per, None].to(lm_head.device))  # [r, 1]
        chosen.append(picked[:, 0].cpu())
        tails.append(log_p.masked_fill(log_p > picked, float("-inf")).logsumexp(dim=-1).cpu())
    return torch.cat(chosen), torch.cat(tails)


def _verdict(url: str, options: ProbeOptions, judged: Sequence[_Token]) -> ProbeVerdict:
    """Not lossless at the first token whose tail is below the threshold; else lossless, with the least
    tail seen."""
    t, threshold = f"T={options.temperature:g}", options.threshold
    least = min(judged, key=lambda token: token.log_tail)
    below = next((token for token in judged if token.log_tail < math.log(threshold)), None)
    verdict = ProbeVerdict(
        lossless=below is None,
        reason=f"lossless: each of {len(judged)} output tokens at {t} has a tail of p_T >= {threshold:g} "
        f"(the smallest: {_probability(least.log_tail)})",
        temperature=options.temperature,
        threshold=threshold,
        tokens=len(judged),
        least_tail=math.exp(least.log_tail),
    )
    if below is None:
        return verdict
    reason = (
        f"--engine {url} is not lossless at T > 0: its output for prompt {below.source} at {t} (registered as "
        f"{below.path}) has at response position {below.position} token {below.token_id}, whose probability under "
        f"the target at {t} is {_probability(below.log_p)} (with every token no more likely: "
        f"{_probability(below.log_tail)}, below {threshold:g}; a lossless sampler outputs such a token with "
        f"probability below {threshold:g}): {_culprit(below.position)} leaves the target's distribution, or it "
        "serves another model"
    )
    update: dict[str, object] = {"reason": reason, "prompt_id": below.source, "registered_prompt_id": below.path}
    update |= {"position": below.position, "token_id": below.token_id, "probability": math.exp(below.log_p)}
    return verdict.model_copy(update=update)


def _probability(log_p: float) -> str:
    """p from its log, readable where exp underflows (e^-961 rather than 0)."""
    return f"{math.exp(log_p):.3g}" if log_p > -700 else f"e^{log_p:.0f}"


def _culprit(position: int) -> str:
    """What chose the token: the first comes from the prefill (the plain sampler, before any draft)."""
    return "its plain sampler (the prefill's token, before any draft)" if position == 0 else "its speculative sampling"
