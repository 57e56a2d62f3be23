"""A readable summary of an EvalReport for the terminal."""

from __future__ import annotations

from schemas.report import EvalReport, TauSummary


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _row(name: str, s: TauSummary) -> str:
    hist = " ".join(f"{tau}:{n}" for tau, n in s.histogram.items())
    return (
        f"{name:<10} {_fmt(s.mean_tau):>8} {_fmt(s.tokens_per_round):>11} {s.total_rounds:>7} "
        f"{s.prompts_evaluated:>7}  {hist}"
    )


def _drafter(r: EvalReport) -> str:
    if r.drafter_family == "eagle3":
        return f"EAGLE-3 ({r.layout} layout), {r.steps} chain steps, draft vocab {r.draft_vocab_size}"
    return f"DFlash, block size {r.block_size}"


def _layers(r: EvalReport) -> str:
    """The served layers, and the checkpoint's own ids with the convention they were read in."""
    text = f"{r.target_layer_ids} (decoder outputs; {r.layer_ids_source})"
    if r.checkpoint_layer_ids is not None and r.checkpoint_layer_ids != r.target_layer_ids:
        how = "--layer-convention" if r.layer_convention_source == "override" else "the layout"
        text += f", written {r.checkpoint_layer_ids} as {r.checkpoint_layer_convention} ({how})"
    return text


def format_report(report: EvalReport) -> str:
    """One report for the terminal: checkpoint, target, layers, and a row per draft kind."""
    step = "-" if report.step is None else str(report.step)
    lines = [
        f"checkpoint  {report.checkpoint_path} ({report.format}, step {step})",
        f"target      {report.target_name} ({report.target_fingerprint}), features stored {report.feature_storage}",
        f"drafter     {_drafter(report)}",
        f"layers      {_layers(report)}",
        "",
        f"{'drafts':<10} {'tau':>8} {'tok/round':>11} {'rounds':>7} {'prompts':>7}  round-tau histogram",
        _row("chain", report.summary.chain),
    ]
    lines += [_row(f"ddtree-{b}", s) for b, s in sorted(report.summary.trees.items())]
    lines += [_row(f"eagle-{k}", s) for k, s in report.summary.eagle_trees.items()]
    lines += [
        "",
        f"tau = mean over prompts of each prompt's mean round tau (bonus token counted); "
        f"{report.summary.wall_time_s:.1f} s on {report.device}",
    ]
    if report.summary.prompts_not_target_greedy:
        lines.append(
            f"warning: {report.summary.prompts_not_target_greedy} prompts have responses that are not the "
            "target's greedy continuation; their tau is not the live greedy loop's"
        )
    return "\n".join(lines)
