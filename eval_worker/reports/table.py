"""A readable summary of an EvalReport for the terminal."""

from __future__ import annotations

from eval_worker.reports.conventions import PER_PROMPT, POOLED, TAU_LEGEND, fmt
from eval_worker.reports.sampling_settings import by_setting
from schemas.report import DFlashDrafting, Eagle3Drafting, EvalReport, ExpectedSummary, SetSummary, TauSummary
from schemas.sampling import GREEDY_SETTING


def _row(name: str, s: TauSummary) -> str:
    hist = " ".join(f"{tau}:{n}" for tau, n in s.histogram.items())
    return (
        f"{name:<22} {fmt(s.mean_tau):>10} {fmt(s.stderr):>7} {fmt(s.tokens_per_round):>7} {s.total_rounds:>7} "
        f"{s.prompts_evaluated:>7}  {hist}"
    )


def _expected_row(name: str, s: ExpectedSummary) -> str:
    rounds = "-"  # expected rounds are not whole
    return (
        f"{name:<22} {fmt(s.mean_tau):>10} {fmt(s.stderr):>7} {fmt(s.tokens_per_round):>7} {rounds:>7} "
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
    """The rows per sampling setting of the responses, T = 0 first; where settings mix, the rows over all
    prompts last, labelled as such (their tau averages greedy and sampled responses together)."""
    found = by_setting(s)
    if len(found) == 1:
        setting = next(iter(found))
        note = [] if setting == GREEDY_SETTING else [f"every response sampled at {setting}"]
        return _rows(s) + note
    lines = ["by sampling setting of the responses (chain: greedy drafting; probabilistic: expected)"]
    for setting, summary in found.items():
        lines += [setting, *_rows(summary, "  ")]
    return [*lines, "all prompts, settings mixed", _row("  chain", s.chain)]


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
        f"{'drafts':<22} {PER_PROMPT:>10} {'s.e.':>7} {POOLED:>7} {'rounds':>7} {'prompts':>7}  round-tau histogram",
        *_by_sampling(report.summary),
        "",
        TAU_LEGEND,
        f"s.e.: standard error of per-prompt over prompts; bonus token counted; "
        f"{report.summary.wall_time_s:.1f} s on {report.device}",
    ]
    if report.summary.prompts_not_target_greedy:
        lines.append(
            f"warning: {report.summary.prompts_not_target_greedy} prompts have responses that are not the "
            "target's greedy continuation; their tau is not the live greedy loop's"
        )
    return "\n".join(lines)
