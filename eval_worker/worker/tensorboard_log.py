"""`eval-worker watch --tensorboard DIR`: each finished checkpoint's taus as TensorBoard scalars at its
training step, where training loops already look: one TensorBoard run per training run, so that each
series has one value per step.

A run is the checkpoint's directory relative to the watched one, and under it how the family drafts
(`dflash-block16`, `eagle3-steps5`, `mtp-steps3`): checkpoints of several runs, families or drafting
lengths under one watched directory never share a series. Tags: `tau/chain`, `tau/ddtree-<budget>`,
`tau/eagle-<topk,depth,total>`, and per prompt set `tau/<set>/chain` and so on. Which jobs were written is
kept at DIR's top (`written-jobs.json`), so a restarted `watch` does not write them again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from schemas.report import DFlashDrafting, EvalReport, SetSummary

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)
_WRITTEN = "written-jobs.json"


def tau_scalars(report: EvalReport) -> dict[str, float]:
    """Tag -> tau of a report: the whole run and each set, chain and every tree (rounds-less ones left out)."""
    groups: dict[str, SetSummary] = {"": report.summary, **{f"{n}/": s for n, s in report.summary.by_set.items()}}
    out: dict[str, float] = {}
    for prefix, s in groups.items():
        kinds = {"chain": s.chain} | {f"ddtree-{b}": t for b, t in s.trees.items()}
        kinds |= {f"eagle-{k}": t for k, t in s.eagle_trees.items()}
        out |= {f"tau/{prefix}{kind}": t.mean_tau for kind, t in kinds.items() if t.mean_tau is not None}
    return out


def run_name(directory: PurePosixPath, report: EvalReport) -> str:
    """The TensorBoard run of a checkpoint in `directory` (relative to the watched one, `.` for itself):
    that directory, then the family and its drafting length."""
    d = report.drafting
    drafting = f"{d.family}-block{d.block_size}" if isinstance(d, DFlashDrafting) else f"{d.family}-steps{d.steps}"
    return str(directory / drafting)


class TensorBoardLog:
    """Writes reports as scalars under one log directory, a subdirectory per run, each job once."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package: fail before watching

        log_dir.mkdir(parents=True, exist_ok=True)
        self._new_writer = SummaryWriter
        self._log_dir = log_dir
        self._written_path = log_dir / _WRITTEN
        self._written: set[str] = (
            set(json.loads(self._written_path.read_text())) if self._written_path.exists() else set()
        )
        self._writers: dict[str, SummaryWriter] = {}

    def has(self, job_id: str) -> bool:
        """Whether this job's report is already in the log."""
        return job_id in self._written

    def write(self, job_id: str, report: EvalReport, directory: PurePosixPath) -> str | None:
        """The report's taus at its training step in its run (`run_name` of the checkpoint's `directory`),
        which is returned; a report without a step is skipped, and said so (None)."""
        run = None
        if report.step is None:
            log.warning("%s has no training step; not written to TensorBoard", report.checkpoint_path)
        else:
            run = run_name(directory, report)
            writer = self._writer(run)
            for tag, value in tau_scalars(report).items():
                writer.add_scalar(tag, value, global_step=report.step)
            writer.flush()
        self._written.add(job_id)
        tmp = self._written_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._written)))
        tmp.replace(self._written_path)
        return run

    def _writer(self, run: str) -> SummaryWriter:
        if run not in self._writers:
            self._writers[run] = self._new_writer(log_dir=str(self._log_dir / run))
        return self._writers[run]

    def close(self) -> None:
        """Flush and close the event files."""
        for writer in self._writers.values():
            writer.close()
