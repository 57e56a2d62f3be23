"""`eval-worker doctor`: a checkpoint evaluated on a few prompts with the layers it declares and with
the usual wrong readings, so that a drafter read in the wrong convention shows as a reading that scores
clearly higher. It never changes what `evaluate` does.

The readings: every id one layer earlier and one layer later (the two conventions), and, when it
declares the target's last layer, that layer through the target's final norm (HF's last
`hidden_states` entry is normed; the cache serves raw decoder outputs). K-1 or K+1 taps are no reading
here: a checkpoint's fc reads exactly its K taps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cache_server.client import CacheClient, HiddenResult, TargetHeads
from cache_server.torch_utils import as_numpy
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.checkpoints.loading import load_with_spec
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.source import FeatureSource
from eval_worker.evaluation.sweep import evaluate_checkpoints, select_prompts
from eval_worker.evaluation.walk_types import TargetNorm
from eval_worker.reports.conventions import PER_PROMPT, POOLED, TAU_LEGEND, fmt
from eval_worker.settings import EvaluateSettings
from schemas.eval_spec import EvalSpec
from schemas.model import ModelInfo

# Another reading is "clearly higher" when its chain tau beats the declared one by both margins.
_RATIO, _ABSOLUTE = 1.1, 0.2
_SHIFTS = {
    -1: ("one layer earlier", "its ids are probably layer inputs (HF hidden_states indices): pass "
                              "--layer-convention layer_input"),
    +1: ("one layer later", "its ids are probably one below the layers it was trained on (an offset convention, "
                            "as SGLang's +1): check how its trainer wrote them and fix its config"),
}  # fmt: skip
_NORMED = (
    "last layer normed",
    "it was probably trained on HF's last hidden_states entry, which is the last layer "
    "after the target's final norm, where this cache (and vLLM) serve its raw output: retrain on raw features",
)


@dataclass(frozen=True)
class Reading:
    """One way to read the checkpoint's layers, the chain tau it scores (per-prompt, the verdict's; and
    pooled), and what it would mean."""

    name: str
    layer_ids: tuple[int, ...]
    chain_tau: float | None
    advice: str = ""
    pooled_tau: float | None = None


class NormedLayer:
    """A `FeatureSource` that serves `layer` through the target's final RMSNorm, as HF's last
    `hidden_states` entry holds it, and every other layer as served."""

    def __init__(self, source: FeatureSource, layer: int, heads: TargetHeads) -> None:
        norm = TargetNorm.served(heads)
        if norm is None:
            raise ValueError("the server's target has no final norm the cache serves (an RMSNorm)")
        self.source, self.layer, self.norm = source, layer, norm

    def model(self) -> ModelInfo:
        """The source's target."""
        return self.source.model()

    def heads(self) -> TargetHeads:
        """The source's heads."""
        return self.source.heads()

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        """The source's features, `layer`'s columns normed as the target's final norm does (`TargetNorm`, its
        weight in the served features' dtype)."""
        result = self.source.hidden(prompt_id, layers)
        if self.layer not in layers:
            return result
        hidden, _ = result.to_torch()
        width, slot = hidden.shape[1] // len(layers), list(layers).index(self.layer)
        cols = slice(slot * width, (slot + 1) * width)
        out = hidden.clone()
        out[:, cols] = self.norm.to(hidden.device, hidden.dtype)(hidden[:, cols])
        return dataclasses.replace(result, hidden=as_numpy(out))


def doctor(
    client: CacheClient,
    checkpoint: Path,
    settings: EvaluateSettings,
    *,
    limit: int,
    spec: EvalSpec | None = None,
) -> list[Reading]:
    """The declared reading first, then each shifted one the target's layers allow, then the normed last
    layer when the checkpoint reads the last layer and the target's final norm is known (the checkpoint
    loaded as `spec` says: its config file, inert keys, family options)."""
    info = client.model()
    loaded = load_with_spec(checkpoint, info, spec or EvalSpec())
    declared = loaded.target_layer_ids
    shifts = [s for s in (-1, +1) if all(0 <= k + s < info.num_layers for k in declared)]
    variants = [loaded, *(_shifted(loaded, s) for s in shifts)]
    ids = select_prompts(client, None, settings.timeout_s)[:limit]
    reports = evaluate_checkpoints(client, variants, settings, prompt_ids=[ids] * len(variants), progress=False)
    chain = reports[0].summary.chain
    readings = [Reading("declared", declared, chain.mean_tau, pooled_tau=chain.tokens_per_round)]
    readings += [
        Reading(_SHIFTS[s][0], v.target_layer_ids, c.mean_tau, _SHIFTS[s][1], c.tokens_per_round)
        for s, v, c in zip(shifts, variants[1:], (r.summary.chain for r in reports[1:]), strict=True)
    ]
    heads = HeadsCache(settings.heads_cache).get(client, info.fingerprint) if info.num_layers - 1 in declared else None
    if heads is not None and heads.final_norm is not None:
        normed = NormedLayer(client, info.num_layers - 1, heads)
        (report,) = evaluate_checkpoints(client, [loaded], settings, prompt_ids=[ids], progress=False, source=normed)
        chain = report.summary.chain
        readings.append(Reading(_NORMED[0], declared, chain.mean_tau, _NORMED[1], chain.tokens_per_round))
    return readings


def _shifted(loaded: LoadedCheckpoint, shift: int) -> LoadedCheckpoint:
    ids = tuple(k + shift for k in loaded.target_layer_ids)
    return dataclasses.replace(loaded, layer_ids=dataclasses.replace(loaded.layer_ids, ids=ids, source="override"))


def verdict(readings: list[Reading]) -> str | None:
    """A plain sentence when another reading scores clearly higher than the declared one, else None."""
    declared = readings[0].chain_tau or 0.0
    best = max(readings[1:], key=lambda r: r.chain_tau or 0.0, default=None)
    if best is None or best.chain_tau is None:
        return None
    if best.chain_tau > declared * _RATIO and best.chain_tau - declared > _ABSOLUTE:
        return f"reading {list(best.layer_ids)} ({best.name}) scores {best.chain_tau:.3f} against {declared:.3f}: " + (
            best.advice
        )
    return None


def format_doctor(checkpoint: Path, readings: list[Reading]) -> str:
    """The table of readings and the verdict."""
    lines = [
        f"{checkpoint}: chain tau per reading of its layers",
        f"{'reading':<20} {'layers':<24} {PER_PROMPT:>10} {POOLED:>7}",
    ]
    lines += [f"{r.name:<20} {list(r.layer_ids)!s:<24} {fmt(r.chain_tau):>10} {fmt(r.pooled_tau):>7}" for r in readings]
    found = verdict(readings)
    lines += [found or "the declared layers score best: nothing suggests another reading", TAU_LEGEND]
    return "\n".join(lines)
