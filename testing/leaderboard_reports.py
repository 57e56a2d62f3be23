"""A leaderboard's worth of EvalReports built from round taus, without a model: eleven reports of six
runs over three families (two runs of one checkpoint with other options), three sampling settings, two
prompt sets. The tables, plots and page are checked for readability against it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from eval_worker.scoring.summary import by_set, round_taus, summarize_set
from schemas.report import (
    DFlashDrafting,
    Drafting,
    Eagle3Drafting,
    EvalReport,
    EvalSummary,
    ExpectedRounds,
    MtpDrafting,
    PromptEval,
)
from schemas.sampling import DraftSampling, SamplingParams

SAMPLED = (SamplingParams(temperature=0.6, top_p=0.95, seed=0), SamplingParams(temperature=1.0, seed=0))
PROMPTS = 8
SAMPLES = 2  # per prompt at each sampled setting
SETS = {"code": [f"g{i}" for i in range(0, PROMPTS, 2)], "prose": [f"g{i}" for i in range(1, PROMPTS, 2)]}


@dataclass(frozen=True)
class Run:
    """One training run's checkpoints: where they are saved, how they draft, how well at each step."""

    path: str  # `{step}` in it
    drafting: Drafting
    steps: tuple[int, ...]
    skill: float  # P(a draft is accepted) at the last step, at T = 0
    draft_sampling: tuple[DraftSampling, ...] = ("greedy",)


RUNS = (
    Run(
        "/runs/dflash-a/step_{step}",
        DFlashDrafting(block_size=8, mask_token_id=5, tree_budgets=[4, 8]),
        (100, 200, 300),
        0.8,
    ),
    Run(
        "/runs/dflash-b/step_{step}",
        DFlashDrafting(block_size=16, mask_token_id=5),
        (100, 200),
        0.7,
        ("greedy", "probabilistic"),
    ),
    Run(
        "/runs/eagle3_step_{step}",
        Eagle3Drafting(steps=5, draft_vocab_size=256, eagle_trees=["4,3,16"]),
        (100, 200),
        0.6,
    ),
    Run("/runs/eagle3_step_{step}", Eagle3Drafting(steps=6, draft_vocab_size=256), (200,), 0.6),
    Run("/runs/mtp_step_{step}", MtpDrafting(steps=1, mtp_layers=1, layout="deepseek"), (200,), 0.5),
    Run("/runs/mtp_step_{step}", MtpDrafting(steps=3, mtp_layers=1, layout="deepseek"), (100, 200), 0.5),
)


def _rounds(rng: random.Random, accept: float, longest: int, tokens: int) -> list[int]:
    """Round taus covering `tokens`: each draft accepted with probability `accept` until one is not."""
    out: list[int] = []
    while sum(out) < tokens:
        tau = 1
        while tau < longest and rng.random() < accept:
            tau += 1
        out.append(min(tau, tokens - sum(out)))
    return out


def _expected(chain: Sequence[int]) -> ExpectedRounds:
    """Probabilistic drafting's numbers, a little above the greedy walk's (as sampling drafts accept more)."""
    rounds = len(chain) * 0.9
    return ExpectedRounds(rounds=rounds, accepted=sum(chain) - rounds, mean_tau=sum(chain) / rounds)


def _prompt(rng: random.Random, run: Run, accept: float, pid: str, sampling: SamplingParams | None) -> PromptEval:
    longest = run.drafting.longest_round
    chain = _rounds(rng, accept, longest, 48)
    greedy = sampling is None
    budgets = run.drafting.tree_budgets if isinstance(run.drafting, DFlashDrafting) and greedy else []
    shapes = run.drafting.eagle_trees if isinstance(run.drafting, Eagle3Drafting) and greedy else []
    return PromptEval(
        prompt_id=pid,
        prompt_len=16,
        num_tokens=64,
        chain=round_taus(chain),
        trees={b: round_taus(_rounds(rng, min(accept + 0.02 * b, 0.97), longest, 48)) for b in budgets},
        eagle_trees={k: round_taus(_rounds(rng, min(accept + 0.1, 0.97), longest, 48)) for k in shapes},
        sampling=sampling,
        probabilistic=_expected(chain) if "probabilistic" in run.draft_sampling and not greedy else None,
        prompt_sha256=pid.split("-")[0].replace("s", "g"),
    )


def _prompts(run: Run, step: int, sampled: Sequence[SamplingParams]) -> list[PromptEval]:
    rng = random.Random(f"{run.path}{run.drafting}{step}")
    accept = run.skill * step / max(run.steps) if len(run.steps) > 1 else run.skill
    out = [_prompt(rng, run, accept, f"g{i}", None) for i in range(PROMPTS)]
    for n, setting in enumerate(sampled):
        for i in range(PROMPTS):
            for j in range(SAMPLES):
                sampling = setting.model_copy(update={"seed": j})
                out.append(_prompt(rng, run, accept * (0.6 - 0.2 * n), f"s{i}-{n}-{j}", sampling))
    return out


def _report(run: Run, step: int, sampled: Sequence[SamplingParams]) -> EvalReport:
    prompts = _prompts(run, step, sampled)
    budgets = run.drafting.tree_budgets if isinstance(run.drafting, DFlashDrafting) else []
    shapes = run.drafting.eagle_trees if isinstance(run.drafting, Eagle3Drafting) else []
    members = {
        name: [*ids, *(p.prompt_id for p in prompts if p.prompt_sha256 in ids and p.sampling)]
        for name, ids in SETS.items()
    }
    summary = EvalSummary(
        **dict(summarize_set(prompts, budgets, shapes)),
        by_set=by_set(prompts, members, budgets, shapes),
        wall_time_s=1.0,
    )
    return EvalReport(
        checkpoint_path=run.path.format(step=step),
        format="hf_dir",
        drafter_family=run.drafting.family,
        layout="dflash" if isinstance(run.drafting, DFlashDrafting) else "eagle",
        step=step,
        epoch=0,
        target_name="tiny",
        target_fingerprint="f" * 16,
        target_layer_ids=[1, 3, 5],
        layer_ids_source="checkpoint",
        drafting=run.drafting,
        draft_sampling=list(run.draft_sampling),
        device="cpu",
        dtype="float32",
        prompts=prompts,
        summary=summary,
    )


def leaderboard_reports(runs: Sequence[Run] = RUNS, sampled: Sequence[SamplingParams] = SAMPLED) -> list[EvalReport]:
    """Every checkpoint of `runs` evaluated: one report per run and step."""
    return [_report(run, step, sampled) for run in runs for step in run.steps]
