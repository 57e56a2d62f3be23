"""A live speculative SAMPLING loop (test support): the ground truth acceptance at T > 0 is checked against.

Chain drafting of K tokens per round by a DFlash drafter (one block `[t[s], MASK * K]`) or an EAGLE-3
drafter (K chain steps, the context recomputed from the target's taps of the committed positions); the
target verifies with a real forward (full recompute) and standard rejection sampling decides, as vLLM
0.32 writes it (`vllm/v1/sample/rejection_sampler.py`):

- p_T = `cache_server.sampling.target_probs` of the target's logits: temperature, min-p, top-k, top-p.
  (vLLM's rejection sampler applies temperature, top-k and top-p at draft positions,
  `apply_sampling_constraints`; min-p, an argmax-invariant logits processor, only reaches its bonus
  token. Here min-p applies everywhere, which is what keeps the output distributed as p_T.)
- Greedy drafting (`draft_sample_method="greedy"`, vLLM's default): the drafts are the drafter's
  argmax and q is one-hot, so draft x is accepted iff p_T(x) >= u; a rejection draws from p_T with x
  zeroed (renormalised).
- Probabilistic drafting: drafts sampled from q_T = softmax(draft logits / T), temperature only - no
  top-k, top-p or min-p (`vllm/v1/spec_decode/llm_base_proposer.py`, `compute_probs_and_sample_next_token`:
  "we ignore most of the sampling parameters in generating the draft tokens. We only use the
  temperature"; DFlash's K parallel rows each take the request's temperature; an EAGLE-3 draft vocab is
  placed in the target vocab with -inf elsewhere, as `llama_eagle3.py` `compute_logits` does). x is
  accepted iff p_T(x) / q_T(x) >= u; a rejection draws from max(0, p_T - q_T) normalised.
- All K accepted: the bonus token from p_T. Temperature 0 is the greedy loop: argmax comparisons,
  no randomness drawn.

Counting follows vLLM's scheduler (`vllm/v1/core/sched/scheduler.py`): a round runs while the request is
unfinished, always verifies all K drafts, and counts its accepted drafts before the stop check cuts the
output at `max_new_tokens` or after a stop token; so a last round may count drafts past the cut (at most
K: the allowance of `eval_worker.parity.compare`). `SampledRun.round_taus` caps that last round at the
tokens the output kept: what the offline walk over the output scores. One seeded `torch.Generator`
draws everything (u, draft samples, recovered and bonus tokens), so a run reproduces. CPU, tiny models.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cache_server.sampling import sample_token, seeded_generator, target_probs
from eval_worker.families.dflash.drafter import DFlashDrafter, draft_block
from eval_worker.families.eagle3.drafter import Eagle3Drafter, NodeBatch
from schemas.sampling import DraftSampling, SamplingParams
from testing.live_loop import target_heads
from testing.taps import target_forward

Chooser = Callable[[Tensor], int]  # draft logits over the target vocab [V] -> the drafted token


@dataclass(frozen=True)
class SampledRun:
    """What one live run generated and how vLLM would count its rounds."""

    token_ids: list[int]  # prompt + generated, cut at max_new_tokens or after the first stop token
    prompt_len: int
    accepted: list[int]  # per round, drafts accepted of the K verified (the last may reach past the cut)

    @property
    def rounds(self) -> int:
        """Draft rounds (vLLM's `num_drafts`)."""
        return len(self.accepted)

    @property
    def round_taus(self) -> list[int]:
        """Each round's accepted + 1, the last capped at the tokens the output kept (the offline walk's)."""
        left, taus = len(self.token_ids) - self.prompt_len, []
        for a in self.accepted:
            taus.append(min(a + 1, left))
            left -= taus[-1]
        return taus


@dataclass(frozen=True)
class Verdict:
    """One round's rejection sampling: drafts accepted, and the tokens it commits (those drafts, then
    the recovered or bonus token)."""

    accepted: int
    tokens: list[int]


def draft_probs(logits: Tensor, temperature: float) -> Tensor:
    """Draft logits [..., V] -> q_T [..., V] in fp32: temperature only, as vLLM's proposer samples."""
    return (logits.float() / temperature).softmax(dim=-1)


def verify_drafts(
    target_logits: Tensor,
    drafts: Sequence[int],
    q: Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> Verdict:
    """Standard rejection sampling of one round.

    target_logits [K+1, V]: row j is the target's next-token logits after the anchor and drafts[:j];
    q [K, V] the draft distributions (None: greedy drafting, one-hot at each draft)."""
    k = len(drafts)
    if params.greedy:
        argmax = [int(t) for t in target_logits.argmax(dim=-1).tolist()]
        a = next((j for j in range(k) if drafts[j] != argmax[j]), k)
        return Verdict(a, [*drafts[:a], argmax[a]])
    p = target_probs(target_logits, params)  # [K+1, V]
    u = torch.rand(k, dtype=torch.float64, generator=generator)  # float64: a u of exactly 0 is negligible
    for j, x in enumerate(drafts):
        q_x = 1.0 if q is None else float(q[j, x])
        if q_x > 0 and float(p[j, x]) / q_x >= float(u[j]):
            continue
        return Verdict(j, [*drafts[:j], _recovered(p[j], x, None if q is None else q[j], generator)])
    return Verdict(k, [*drafts, int(torch.multinomial(p[k], 1, generator=generator))])


def _recovered(p: Tensor, x: int, q: Tensor | None, generator: torch.Generator | None) -> int:
    """A token from the residual after rejecting x: p with x zeroed, or max(0, p - q) (both [V])."""
    residual = p.clone().index_fill_(0, torch.tensor([x]), 0.0) if q is None else (p - q).clamp(min=0.0)
    if float(residual.sum()) <= 0:  # only by rounding (a rejection leaves mass elsewhere): p itself
        residual = p
    return int(torch.multinomial(residual, 1, generator=generator))


def _chooser(draft_sampling: DraftSampling, params: SamplingParams, generator: torch.Generator | None) -> Chooser:
    if draft_sampling == "greedy" or params.greedy:
        return lambda logits: int(logits.argmax())
    return lambda logits: int(torch.multinomial(draft_probs(logits, params.temperature), 1, generator=generator))


def _dflash_drafts(
    drafter: DFlashDrafter,
    taps: Tensor,
    committed: Sequence[int],
    k: int,
    heads: tuple[Tensor, Tensor],
    choose: Chooser,
) -> tuple[list[int], Tensor]:
    """K drafts of one block `[t[s], MASK * K]` over taps [s, K*H] of positions < s -> (drafts, logits [K, V])."""
    block = torch.tensor([committed[-1]] + [drafter.cfg.mask_token_id] * k)
    logits = draft_block(drafter, taps, block, *heads)
    return [choose(row) for row in logits], logits


def _eagle3_drafts(
    drafter: Eagle3Drafter, taps: Tensor, committed: Sequence[int], k: int, embed: Tensor, choose: Chooser
) -> tuple[list[int], Tensor]:
    """K chain steps from the anchor s = len(committed) - 1, each fed the token chosen before it
    -> (drafts, their logits over the target vocab [K, V])."""
    s = len(committed) - 1
    # prefill pairs taps i with token i+1 and never reads its last taps row: any row stands in for s
    ctx = drafter.prefill(torch.cat([taps[:s], taps[:1]]), torch.tensor(list(committed)), embed)
    x = ctx.roots[s - 1]  # [H]: the drafter's output at s-1, the round's root
    nodes_k = nodes_v = ctx.keys.new_zeros(1, ctx.keys.shape[0], 0, ctx.keys.shape[2])  # [1, nkv, j, D]
    targets = drafter.to_target(torch.arange(drafter.cfg.draft_vocab_size))
    drafts: list[int] = []
    rows: list[Tensor] = []
    for j in range(k):
        rows.append(torch.full((drafter.cfg.vocab_size,), float("-inf")).index_copy_(0, targets, drafter.logits(x)))
        drafts.append(choose(rows[-1]))
        if j + 1 < k:
            visible = torch.ones(1, 1, j, dtype=torch.bool)
            batch = NodeBatch(ctx.keys[None], ctx.values[None], None, torch.tensor([s]), nodes_k, nodes_v, visible)
            token = torch.tensor([[drafts[-1]]])
            out, key, value = drafter.step(drafter.feedback(x)[None, None], token, torch.tensor([s + j]), batch, embed)
            x, nodes_k, nodes_v = out[0, 0], torch.cat([nodes_k, key], dim=2), torch.cat([nodes_v, value], dim=2)
    return drafts, torch.stack(rows)


def _finished(generated: Sequence[int], max_new_tokens: int, stops: Collection[int]) -> bool:
    return len(generated) >= max_new_tokens or any(t in stops for t in generated)


def _cut(generated: Sequence[int], max_new_tokens: int, stops: Collection[int]) -> list[int]:
    """The output: at most max_new_tokens tokens, ending at the first stop token (kept)."""
    kept = list(generated[:max_new_tokens])
    end = next((i + 1 for i, t in enumerate(kept) if t in stops), len(kept))
    return kept[:end]


@torch.no_grad()
# keyword-only knobs of the live loop
def speculative_sample(  # noqa: PLR0913
    target: nn.Module,
    drafter: DFlashDrafter | Eagle3Drafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    layer_ids: Sequence[int],
    params: SamplingParams,
    *,
    k: int,
    draft_sampling: DraftSampling = "greedy",
    generator: torch.Generator | None = None,
    stop_token_ids: Collection[int] = (),
    verify_params: SamplingParams | None = None,
) -> SampledRun:
    """Speculative sampling of up to `max_new_tokens` tokens after `prompt_ids` at `params`, K drafts a round.

    `generator` (else one seeded with `params.seed`) draws everything. `verify_params` is the
    distribution the rejection sampler verifies against (default: `params`); anything else is a
    deliberately lossy engine (the first token still comes from `params`, as a separate sampler would)."""
    if k < 1 or max_new_tokens < 1:
        raise ValueError("k and max_new_tokens must be at least 1")
    verify_params = verify_params or params
    if generator is None and not (params.greedy and verify_params.greedy):
        if params.seed is None:
            raise ValueError("sampling at T > 0 needs params.seed or a generator: runs must reproduce")
        generator = seeded_generator(params.seed, "cpu")
    embed, lm_head = target_heads(target)
    choose = _chooser(draft_sampling, params, generator)
    prefill = target_forward(target, torch.tensor([list(prompt_ids)]), layer_ids)
    committed = [*prompt_ids, sample_token(prefill.logits[0, -1], params, generator)]
    taps, s, n = prefill.taps[0], len(prompt_ids), len(prompt_ids)
    accepted: list[int] = []
    while not _finished(committed[n:], max_new_tokens, stop_token_ids):
        if isinstance(drafter, DFlashDrafter):
            drafts, logits = _dflash_drafts(drafter, taps, committed, k, (embed, lm_head), choose)
        else:
            own = drafter.embed_tokens.weight if drafter.has_embed else embed
            drafts, logits = _eagle3_drafts(drafter, taps, committed, k, own, choose)
        q = None if draft_sampling == "greedy" or params.greedy else draft_probs(logits, params.temperature)
        verify = target_forward(target, torch.tensor([committed + drafts]), layer_ids)
        verdict = verify_drafts(verify.logits[0, s:], drafts, q, verify_params, generator)
        accepted.append(verdict.accepted)
        committed += verdict.tokens
        taps = verify.taps[0, : s + verdict.accepted + 1]  # the target's taps of the committed positions < s'
        s += verdict.accepted + 1
    return SampledRun([*prompt_ids, *_cut(committed[n:], max_new_tokens, stop_token_ids)], n, accepted)
