"""A readable summary of an EvalReport for the terminal."""

from __future__ import annotations

from schemas.report import DFlashDrafting, Eagle3Drafting, EvalReport, ExpectedSummary, SetSummary, TauSummary
from schemas.sampling import GREEDY_SETTING


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _row(name: str, s: TauSummary) -> str:
    hist = " ".join(f"{tau}:{n}" for tau, n in s.histogram.items())
    return (
        f"{name:<16} {_fmt(s.mean_tau):>8} {_fmt(s.stderr):>7} {_fmt(s.tokens_per_round):>11} {s.total_rounds:>7} "
        f"{s.prompts_evaluated:>7}  {hist}"
    )


def _expected_row(name: str, s: ExpectedSummary) -> str:
    rounds = "-"  # expected rounds are not whole
    return (
        f"{name:<16} {_fmt(s.mean_tau):>8} {_fmt(s.stderr):>7} {_fmt(s.tokens_per_round):>11} {rounds:>7} "
        f"{s.prompts_evaluated:>7}"
    )


def _rows(s: SetSummary, prefix: str = "") -> list[str]:
    """Chain, trees and probabilistic drafting of one summary."""
    lines = [_row(f"{prefix}chain", s.chain)]
    lines += [_row(f"{prefix}ddtree-{b}", t) for b, t in sorted(s.trees.items())]
    lines += [_row(f"{prefix}eagle-{k}", t) for k, t in s.eagle_trees.items()]
    if s.probabilistic is not None:
        lines.append(_expected_row(f"{prefix}probabilistic", s.probabilistic))
    return lines


def _by_sampling(s: SetSummary) -> list[str]:
    """One block per sampling setting of the responses, when any was sampled (T > 0)."""
    if set(s.by_sampling) <= {GREEDY_SETTING}:
        return []
    if len(s.by_sampling) == 1:
        return ["", f"every response sampled at {next(iter(s.by_sampling))}"]
    lines = ["", "by sampling setting of the responses (chain: greedy drafting; probabilistic: expected)"]
    for setting, summary in s.by_sampling.items():
        lines += [f"  {setting}", *("  " + line for line in _rows(summary))]
    return lines


def _drafter(r: EvalReport) -> str:
    """The family's line, from its own drafting block."""
    d = r.drafting
    if isinstance(d, DFlashDrafting):
        return f"DFlash, block size {d.block_size}, mask token {d.mask_token_id}"
    if isinstance(d, Eagle3Drafting):
        return f"EAGLE-3 ({r.layout} layout), {d.steps} chain steps, draft vocab {d.draft_vocab_size}"
    return f"MTP ({d.layout} layout), {d.steps} chain steps over {d.mtp_layers} MTP layers"


def _loading(r: EvalReport) -> list[str]:
    """What loading accepted that a reader should know: config keys taken as inert, warnings."""
    lines = (
        [f"inert       config keys accepted as inert: {', '.join(r.inert_config_keys)}"] if r.inert_config_keys else []
    )
    return lines + [f"warning     {w}" for w in r.warnings]


def _layers(r: EvalReport) -> str:
    """The served layers, and the checkpoint's own ids with the convention they were read in."""
    text = f"{r.target_layer_ids} (decoder outputs; {r.layer_ids_source})"
    if r.checkpoint_layer_ids is not None and r.checkpoint_layer_ids != r.target_layer_ids:
        how = "--layer-convention" if r.layer_convention_source == "override" else "the layout"
        text += f", written {r.checkpoint_layer_ids} as {r.checkpoint_layer_convention} ({how})"
    return text


def _counted(kinds: dict[str, int]) -> str:
    """`{"hf float32": 12}` -> `hf float32 (12 prompts)`; `not recorded` for a report from before."""
    return ", ".join(f"{kind} ({n} prompts)" for kind, n in sorted(kinds.items())) or "not recorded"


def format_report(report: EvalReport) -> str:
    """One report for the terminal: checkpoint, target, layers, and a row per draft kind."""
    step = "-" if report.step is None else str(report.step)
    lines = [
        f"checkpoint  {report.checkpoint_path} ({report.format}, step {step})",
        f"target      {report.target_name} ({report.target_fingerprint}), features stored {report.feature_storage}",
        f"drafter     {_drafter(report)}",
        f"layers      {_layers(report)}",
        *_loading(report),
        f"captured by {_counted(report.summary.captures)}; responses by {_counted(report.summary.generators)}",
        "",
        f"{'drafts':<16} {'tau':>8} {'s.e.':>7} {'tok/round':>11} {'rounds':>7} {'prompts':>7}  round-tau histogram",
        *_rows(report.summary),
        *_by_sampling(report.summary),
        "",
        f"tau = mean over prompts of each prompt's mean round tau (bonus token counted), s.e. its standard error "
        f"over prompts; {report.summary.wall_time_s:.1f} s on {report.device}",
    ]
    if report.summary.prompts_not_target_greedy:
        lines.append(
            f"warning: {report.summary.prompts_not_target_greedy} prompts have responses that are not the "
            "target's greedy continuation; their tau is not the live greedy loop's"
        )
    return "\n".join(lines)
