"""A run's name in tables, plots and the leaderboard page: the checkpoint's name without its step, and
the options it was evaluated with (the page's script words it the same way). Two evaluations of one
checkpoint with other options get two labels; the steps of one run share one."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from schemas.report import DFlashDrafting, Eagle3Drafting, EvalReport

_WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def run_name(report: EvalReport) -> str:
    """The checkpoint's file or directory name with the step left out (`dflash_step_200` -> `dflash`,
    `runs/v4/step_200.pt` -> `v4`): every saved step of one training run has the same name."""
    path = PurePosixPath(report.checkpoint_path.replace("\\", "/"))
    name = path.name
    for suffix in _WEIGHT_SUFFIXES:
        name = name.removesuffix(suffix)
    if report.step is not None:
        step = rf"(?:step|checkpoint|ckpt|iter|global_step)?[-_.]?0*{report.step}"
        name = re.sub(rf"(?:^|[-_.]){step}$", "", name, flags=re.IGNORECASE)
    return name or path.parent.name or report.checkpoint_path


def _plural(n: int | None, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def run_options(report: EvalReport) -> str:
    """The options a run was evaluated with: the family's round length and trees, the drafting modes
    beyond greedy, a lossy feature store, layers given by hand."""
    d = report.drafting
    if isinstance(d, DFlashDrafting):
        parts = [f"DFlash block {d.block_size}"]
        if d.tree_budgets:
            parts.append(f"ddtree {','.join(map(str, d.tree_budgets))}")
    elif isinstance(d, Eagle3Drafting):
        parts = [f"EAGLE-3 {_plural(d.steps, 'step')}"] + [f"tree {k}" for k in d.eagle_trees]
    else:
        parts = [f"MTP {_plural(d.steps, 'step')}"]
    if "probabilistic" in report.draft_sampling:
        parts.append("probabilistic")
    if report.feature_storage != "exact":
        parts.append(report.feature_storage.split(" ", 1)[0])
    if report.layer_ids_source == "override":
        parts.append(f"layers {','.join(map(str, report.target_layer_ids))}")
    return ", ".join(parts)


def run_label(report: EvalReport) -> str:
    """`dflash: DFlash block 8, ddtree 4,8, probabilistic`; `eagle3: EAGLE-3 5 steps, tree 4,3,16`."""
    return f"{run_name(report)}: {run_options(report)}"
