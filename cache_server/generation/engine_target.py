"""A target captured by its serving engine: the server loads its tokenizer and heads only, and checks
the engine once at startup with a probe prompt (generated greedily on the engine, then prefilled):
the file its connector writes names the engine's capture layers, which must be the server's, and the
engine's own last layer through the target's heads must give the engine's own greedy tokens."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import httpx

from cache_server.capture.heads import Heads
from cache_server.capture.model_dir import check_model_dir
from cache_server.capture.target import ModelShape, Target, target_info
from cache_server.generation.capture_files import CaptureFileError, EngineLaunch, take_capture_file
from cache_server.generation.engine import Engine, EngineError, EngineUnavailable, EngineUnfit, generate_once
from cache_server.generation.engine_capture import EngineCapturer, prefill
from cache_server.generation.startup import PROBE_TEXT, PROBE_TOKENS
from cache_server.torch_utils import TORCH_DTYPES
from schemas.layers import format_layer_list
from schemas.prompts import PromptSpec
from schemas.storage import StorageName

log = logging.getLogger(__name__)


def open_engine_target(
    model_dir: Path,
    engine: Engine,
    *,
    files: Path,
    capture_layers: Sequence[int],
    storage: StorageName,
    timeout_s: float,
    concurrency: int,
    orphan_after_s: float,
    dtype: str | None = None,
) -> Target:
    """The target whose layers `engine` computes into `files`; EngineUnfit (one line) when the engine
    cannot capture it: no capture file, other capture layers than `capture_layers`, no last layer, or
    states that do not give the engine's own greedy tokens through the target's heads. Files in `files`
    older than `orphan_after_s` that no capture took are swept. `dtype`, when given, must be the engine's
    (the states are stored in the engine's dtype)."""
    check_model_dir(model_dir)
    shape = ModelShape.of(model_dir)
    prompts = shape.tokenizer(model_dir)
    probe = prompts.encode(PromptSpec(text=PROBE_TEXT))
    sequence = probe + generate_once(engine, probe, PROBE_TOKENS, timeout_s=timeout_s, files=files)
    launch = _probe_launch(engine, sequence, files, shape.hidden_size, timeout_s)
    _check_layers(launch, capture_layers, shape.num_layers)
    if dtype is not None and dtype != launch.dtype:
        raise EngineUnfit(f"--dtype {dtype} differs from the engine's {launch.dtype}: launch both with one dtype")
    heads = Heads.from_checkpoint(model_dir, TORCH_DTYPES[launch.dtype])
    if heads.final_norm is None:
        raise EngineUnfit(
            f"{model_dir.name}'s final norm is not an RMSNorm the cache serves: responses cannot be checked from the "
            "engine's states (capture it in-process: --capture hf)"
        )
    capturer = EngineCapturer(
        engine,
        launch,
        heads,
        files=files,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        timeout_s=timeout_s,
        concurrency=concurrency,
        orphan_after_s=orphan_after_s,
    )
    try:
        (probed,) = capturer.capture([sequence], [len(probe)], [shape.num_layers - 1])
    except EngineUnavailable as e:  # away since the first probe, or it lost this one's file (CaptureLost)
        capturer.close()
        raise EngineUnfit(f"--generator {engine.url}: the probe capture failed: {e}") from None
    if isinstance(probed, Exception) or probed.greedy_mismatches != 0:
        capturer.close()
        why = probed if isinstance(probed, Exception) else f"{probed.greedy_mismatches} of {PROBE_TOKENS} differ"
        raise EngineUnfit(
            f"--generator {engine.url} ({engine.model}): its last layer through {model_dir.name}'s heads does "
            f"not give its own greedy tokens for the probe prompt ({why}): is it serving another model?"
        )
    log.info("layers %s captured by %s (%s)", format_layer_list(launch.layers), engine.url, launch.capture.describe())
    return Target(target_info(model_dir, shape, capturer, storage), prompts, heads, capturer, forward=None)


def _probe_launch(engine: Engine, sequence: list[int], files: Path, hidden_size: int, timeout_s: float) -> EngineLaunch:
    """How the engine captures, read from the file of one prefill."""
    try:
        with httpx.Client(timeout=timeout_s) as client:
            path = prefill(client, engine, sequence, files)
        return take_capture_file(path, sequence, hidden_size)[0]
    except (EngineError, CaptureFileError) as e:
        raise EngineUnfit(f"--generator {engine.url}: the probe capture failed: {e}") from None


def _check_layers(launch: EngineLaunch, capture_layers: Sequence[int], num_layers: int) -> None:
    """EngineUnfit unless the engine captures exactly `capture_layers`, the last layer among them."""
    ours, theirs = sorted(capture_layers), sorted(launch.layers)
    if ours != theirs:
        raise EngineUnfit(
            f"--capture-layers {format_layer_list(ours)} differ from the engine's capture layers "
            f"{format_layer_list(theirs)} (its eagle_aux_hidden_state_layer_ids "
            f"{list(launch.aux_layer_ids)}, each layer + 1): launch both with the same set"
        )
    if num_layers - 1 not in theirs:
        raise EngineUnfit(
            f"the engine does not capture the last layer {num_layers - 1} (aux id {num_layers}), which the "
            "response checks read: add it to both sets"
        )
