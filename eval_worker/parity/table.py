"""The printed parity report: a header naming the checkpoint, the engine and (at T > 0) the sampling
setting and the probe's verdict, one row per prompt (per sample at T > 0), and the overall lines: the
verdict, and tau both ways (pooled, as vLLM reports it, and per-prompt, as the leaderboard does)."""

from __future__ import annotations

from collections.abc import Sequence

from eval_worker.parity.compare import tau
from eval_worker.reports.conventions import PER_PROMPT, POOLED, fmt
from schemas.parity import DistributionCheck, ParityReport, PromptParity


def format_parity(report: ParityReport) -> str:
    """The per-prompt table and the overall lines."""
    lines = [
        f"{report.checkpoint_path} ({report.drafter_family}, {report.speculative_tokens} draft tokens per round) on "
        f"{report.engine_url} ({report.engine_model}, vLLM {report.engine_version or '?'})",
    ]
    if report.sampling.greedy:
        lines.append(f"{'prompt':<26} {'tokens':>6} {'live drafts/acc':>16} {'offline rounds/acc':>19}  verdict")
        lines += [_greedy_row(p) for p in report.prompts]
        lines += [f"{report.agreeing} of {len(report.prompts)} prompts agree", _taus(report)]
        return "\n".join(lines)
    lines += [_setting_line(report), f"probe: {report.probe.reason if report.probe else 'none'}"]
    offline = "offline rounds/acc" if report.draft_sampling == "greedy" else "offline E[rounds/acc]"
    lines.append(
        f"{'prompt':<26} {'seed':>5} {'engine path':<26} {'tokens':>6} {'live drafts/acc':>16} {offline:>21}  verdict"
    )
    lines += [_sampled_row(p) for p in report.prompts]
    if report.distribution is None:
        lines += [f"{report.agreeing} of {len(report.prompts)} samples agree", _taus(report)]
    else:
        lines += [_distribution_line(report.distribution), _taus(report)]
    return "\n".join(lines)


def _setting_line(report: ParityReport) -> str:
    first = report.sampling.seed or 0
    seeds = f"seed {first}" if report.samples == 1 else f"seeds {first}..{first + report.samples - 1}"
    return f"sampling {report.setting}, {seeds} per prompt, {report.draft_sampling} drafting"


def _verdict(p: PromptParity) -> str:
    if p.agrees is None:
        return p.why
    return f"{'agrees' if p.agrees else 'DIFFERS'}: {p.why}"


def _greedy_row(p: PromptParity) -> str:
    return (
        f"{p.prompt_id:<26} {p.response_tokens:>6} {p.live_drafts:>7}/{p.live_accepted:<8} "
        f"{p.offline_rounds:>9}/{p.offline_accepted:<9}  {_verdict(p)}"
    )


def _sampled_row(p: PromptParity) -> str:
    if p.expected is not None:
        offline = f"{p.expected.rounds:>10.2f}/{p.expected.accepted:<10.2f}"
    else:
        offline = f"{p.offline_rounds:>10}/{p.offline_accepted:<10}"
    return (
        f"{p.prompt_id:<26} {p.seed:>5} {p.registered_prompt_id or '-':<26} {p.response_tokens:>6} "
        f"{p.live_drafts:>7}/{p.live_accepted:<8} {offline}  {_verdict(p)}"
    )


def _distribution_line(d: DistributionCheck) -> str:
    low, high = d.interval
    return (
        f"probabilistic drafting over all {d.live_rounds} rounds: live {d.live_mean:.3f} accepted per round, "
        f"expected {d.expected_mean:.3f}; {d.confidence:.0%} interval {low:.3f}..{high:.3f} (stderr {d.stderr:.3f}; "
        f"a shift of {d.detectable:.3f} is caught {d.power:.0%} of the time): {'agrees' if d.agrees else 'DIFFERS'}"
    )


def _mean(values: Sequence[float | None]) -> str:
    found = [v for v in values if v is not None]
    return fmt(sum(found) / len(found)) if found else "-"


def _offline_tau(p: PromptParity) -> float | None:
    """One prompt's offline mean round tau: its chain walk's, or the expectation under probabilistic drafting."""
    if p.expected is not None:
        return p.expected.mean_tau
    return tau(p.offline_rounds or 0, p.offline_accepted or 0)


def _taus(report: ParityReport) -> str:
    """Both conventions on both sides: pooled (vLLM's own) and per-prompt (the leaderboard's headline)."""
    live = _mean([tau(p.live_drafts, p.live_accepted) for p in report.prompts])
    offline = _mean([_offline_tau(p) for p in report.prompts])
    return (
        f"tau {POOLED} (1 + accepted/drafts, vLLM): live {fmt(report.live_tau)}, offline {fmt(report.offline_tau)}; "
        f"{PER_PROMPT} (DFlash, SGLang): live {live}, offline {offline}"
    )
