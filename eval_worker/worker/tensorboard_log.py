"""`eval-worker watch --tensorboard DIR`: each finished checkpoint's taus as TensorBoard scalars at its
training step, in the run's own log directory, where training loops already look.

Tags: `tau/chain`, `tau/ddtree-<budget>`, `tau/eagle-<topk,depth,total>`, and per prompt set
`tau/<set>/chain` and so on. Which jobs were written is kept beside the events (`written-jobs.json`), so
a restarted `watch` does not write them again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from schemas.report import EvalReport, SetSummary

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


class TensorBoardLog:
    """Writes reports as scalars into one log directory, each job once."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        log_dir.mkdir(parents=True, exist_ok=True)
        self._written_path = log_dir / _WRITTEN
        self._written: set[str] = (
            set(json.loads(self._written_path.read_text())) if self._written_path.exists() else set()
        )
        self._writer = SummaryWriter(log_dir=str(log_dir))
        self.last_step: int | None = None

    def has(self, job_id: str) -> bool:
        """Whether this job's report is already in the log."""
        return job_id in self._written

    def write(self, job_id: str, report: EvalReport) -> None:
        """The report's taus at its training step (a report without a step is skipped, and said so)."""
        if report.step is None:
            log.warning("%s has no training step; not written to TensorBoard", report.checkpoint_path)
        else:
            self.last_step = report.step
            for tag, value in tau_scalars(report).items():
                self._writer.add_scalar(tag, value, global_step=report.step)
            self._writer.flush()
        self._written.add(job_id)
        tmp = self._written_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self._written)))
        tmp.replace(self._written_path)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
