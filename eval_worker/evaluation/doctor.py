"""`eval-worker doctor`: a checkpoint evaluated on a few prompts with the layers it declares and with
the usual wrong readings (every id one layer earlier, one layer later), so that a drafter read in the
wrong convention shows as a reading that scores clearly higher. It never changes what `evaluate` does.
(The normed last layer is not a reading here: the cache keeps raw outputs and the worker has no final
norm; K-1 or K+1 taps never fit the checkpoint's fc.)"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from cache_server.client import CacheClient
from eval_worker.checkpoints.loading import LoadedCheckpoint, load_checkpoint
from eval_worker.evaluation.sweep import evaluate_checkpoints, select_prompts
from eval_worker.settings import EvaluateSettings

# Another reading is "clearly higher" when its chain tau beats the declared one by both margins.
_RATIO, _ABSOLUTE = 1.1, 0.2
_ADVICE = {
    -1: "its ids are probably layer inputs (HF hidden_states indices): pass --layer-convention layer_input",
    +1: "its ids are probably one below the layers it was trained on (an offset convention, as SGLang's +1): "
    "check how its trainer wrote them and fix its config",
}


@dataclass(frozen=True)
class Reading:
    """One way to read the checkpoint's layers, and the chain tau it scores."""

    name: str
    shift: int
    layer_ids: tuple[int, ...]
    chain_tau: float | None


def doctor(
    client: CacheClient,
    checkpoint: Path,
    settings: EvaluateSettings,
    *,
    limit: int,
    config_path: Path | None = None,
    mask_token_id: int | None = None,
) -> list[Reading]:
    """The declared reading first, then each shifted one the target's layers allow."""
    info = client.model()
    loaded = load_checkpoint(checkpoint, info, config_path=config_path, mask_token_id=mask_token_id)
    declared = loaded.target_layer_ids
    shifts = [s for s in (0, -1, +1) if all(0 <= k + s < info.num_layers for k in declared)]
    variants = [_shifted(loaded, s) for s in shifts]
    ids = select_prompts(client, None, settings.timeout_s)[:limit]
    reports = evaluate_checkpoints(client, variants, settings, prompt_ids=[ids] * len(variants), progress=False)
    names = {0: "declared", -1: "one layer earlier", +1: "one layer later"}
    return [
        Reading(names[s], s, v.target_layer_ids, r.summary.chain.mean_tau)
        for s, v, r in zip(shifts, variants, reports, strict=True)
    ]


def _shifted(loaded: LoadedCheckpoint, shift: int) -> LoadedCheckpoint:
    if shift == 0:
        return loaded
    ids = tuple(k + shift for k in loaded.target_layer_ids)
    return dataclasses.replace(loaded, layer_ids=dataclasses.replace(loaded.layer_ids, ids=ids, source="override"))


def verdict(readings: list[Reading]) -> str | None:
    """A plain sentence when another reading scores clearly higher than the declared one, else None."""
    declared = readings[0].chain_tau or 0.0
    best = max(readings[1:], key=lambda r: r.chain_tau or 0.0, default=None)
    if best is None or best.chain_tau is None:
        return None
    if best.chain_tau > declared * _RATIO and best.chain_tau - declared > _ABSOLUTE:
        return (
            f"reading {list(best.layer_ids)} ({best.name}) scores {best.chain_tau:.3f} against {declared:.3f}: "
            + (_ADVICE[best.shift])
        )
    return None


def format_doctor(checkpoint: Path, readings: list[Reading]) -> str:
    """The table of readings and the verdict."""
    lines = [f"{checkpoint}: chain tau per reading of its layers", f"{'reading':<20} {'layers':<24} chain tau"]
    for r in readings:
        tau = "-" if r.chain_tau is None else f"{r.chain_tau:.3f}"
        lines.append(f"{r.name:<20} {list(r.layer_ids)!s:<24} {tau}")
    found = verdict(readings)
    lines.append(found or "the declared layers score best: nothing suggests another reading")
    return "\n".join(lines)
