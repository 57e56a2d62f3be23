"""The printed parity report gives tau both ways on both sides: pooled, as vLLM reports it, and per-prompt,
as the leaderboard does (the demo's DFlash checkpoint: 2.344 pooled, 3.259 per-prompt)."""

from __future__ import annotations

from eval_worker.parity.table import format_parity
from schemas.parity import ParityReport, PromptParity

# docs/parity.md's run: six prompts of 12 rounds accepting 36 drafts, two held-out ones that accept 0 and 3
COUNTS = [(12, 36)] * 6 + [(47, 0), (44, 3)]


def _report() -> ParityReport:
    rows = [
        PromptParity(
            prompt_id=f"p{i}",
            response_tokens=48,
            first_token_difference=None,
            live_drafts=drafts,
            live_accepted=accepted,
            offline_rounds=drafts,
            offline_accepted=accepted,
            agrees=True,
            why="identical",
        )
        for i, (drafts, accepted) in enumerate(COUNTS)
    ]
    pooled = 1 + sum(a for _, a in COUNTS) / sum(d for d, _ in COUNTS)
    return ParityReport(
        checkpoint_path="runs/dflash_step_200",
        drafter_family="dflash",
        speculative_tokens=3,
        engine_url="http://127.0.0.1:8100",
        engine_model="target",
        engine_version="0.32.0",
        target_fingerprint="f" * 16,
        prompts=rows,
        agreeing=len(rows),
        agrees=True,
        live_tau=pooled,
        offline_tau=pooled,
    )


def test_the_overall_lines_give_pooled_and_per_prompt_tau() -> None:
    per_prompt = sum(1 + a / d for d, a in COUNTS) / len(COUNTS)
    assert (f"{per_prompt:.3f}", f"{1 + 219 / 163:.3f}") == ("3.259", "2.344")
    lines = format_parity(_report()).splitlines()
    assert lines[-2] == "8 of 8 prompts agree"
    assert lines[-1] == (
        "tau pooled (1 + accepted/drafts, vLLM): live 2.344, offline 2.344; "
        "per-prompt (DFlash, SGLang): live 3.259, offline 3.259"
    )
