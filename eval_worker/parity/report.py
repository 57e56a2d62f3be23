"""A parity run's rows put together: the verdict and tau as vLLM averages it (1 + accepted / drafts over
all rounds) on both sides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.parity.compare import tau
from eval_worker.parity.engine import VllmEngine
from schemas.model import ModelInfo
from schemas.parity import DistributionCheck, ParityReport, ProbeVerdict, PromptParity
from schemas.sampling import GREEDY, DraftSampling, SamplingParams
from schemas.storage import describe_storage


@dataclass(frozen=True)
class RunSetting:
    """What the engine was asked: the sampling setting (its seed the first sample's), samples per
    prompt, and how the engine drafts (as its speculative config's `draft_sample_method`)."""

    sampling: SamplingParams = GREEDY
    samples: int = 1
    draft_sampling: DraftSampling = "greedy"


def parity_report(
    loaded: LoadedCheckpoint,
    engine: VllmEngine,
    info: ModelInfo,
    k: int,
    setting: RunSetting,
    rows: Sequence[PromptParity],
    *,
    probe: ProbeVerdict | None = None,
    distribution: DistributionCheck | None = None,
) -> ParityReport:
    """The report: the rows, the verdict (the probe found the engine lossless, where it looked, and every
    prompt agrees, or the test over all rounds passes), and tau on both sides."""
    agrees = probe is None or probe.lossless is not False
    live_tau: float | None
    offline_tau: float | None
    if distribution is not None:
        agrees = agrees and distribution.agrees and all(r.agrees is not False for r in rows)
        live_tau, offline_tau = 1 + distribution.live_mean, 1 + distribution.expected_mean
    else:
        agrees = agrees and all(r.agrees for r in rows)
        live_tau = tau(sum(r.live_drafts for r in rows), sum(r.live_accepted for r in rows))
        offline_tau = tau(sum(r.offline_rounds or 0 for r in rows), sum(r.offline_accepted or 0 for r in rows))
    return ParityReport(
        checkpoint_path=str(loaded.path),
        drafter_family=loaded.family,
        speculative_tokens=k,
        engine_url=engine.url,
        engine_model=engine.model,
        engine_version=engine.version,
        target_fingerprint=info.fingerprint,
        feature_storage=describe_storage(info.storage),
        sampling=setting.sampling,
        setting=setting.sampling.setting,
        samples=setting.samples,
        draft_sampling=setting.draft_sampling,
        probe=probe,
        prompts=list(rows),
        agreeing=sum(r.agrees is True for r in rows),
        distribution=distribution,
        agrees=agrees and bool(rows),
        live_tau=live_tau if rows else None,
        offline_tau=offline_tau if rows else None,
    )
