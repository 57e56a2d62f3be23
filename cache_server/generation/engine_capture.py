"""The serving engine as a `Capturer`: each sequence (prompt + response) goes to the engine as a
prefill (`max_tokens` 1), its hidden-states connector writes the layers to a file in a directory
both share (`capture_files.py`), and the server reads it, checks it and converts the engine's aux
layer ids to this project's (aux id k + 1 is layer k) here and nowhere else. The response checks run
on the last layer's raw output through the target's heads, as the target's own forward would."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from cache_server.capture.captured import Captured
from cache_server.capture.heads import Heads
from cache_server.generation.capture_files import (
    CaptureFileError,
    CaptureFileMissing,
    EngineLaunch,
    sweep_capture_files,
    take_capture_file,
    written_file,
)
from cache_server.generation.engine import (
    CaptureLost,
    Engine,
    EngineError,
    EngineRefused,
    EngineUnavailable,
    error_message,
)
from schemas.sampling import SamplingParams


def prefill_body(engine: Engine, sequence: Sequence[int]) -> dict[str, object]:
    """`POST /v1/completions` for one sequence's prefill: its states are what the connector keeps; the
    one token generated is thrown away."""
    return {"model": engine.model, "prompt": list(sequence), "max_tokens": 1, "temperature": 0.0}


def prefill(client: httpx.Client, engine: Engine, sequence: Sequence[int], files: Path) -> Path:
    """Prefill `sequence` on the engine; the path of the file its connector wrote, under `files` (the
    engine's directory as this server mounts it). EngineUnavailable (no answer, 5xx), EngineRefused
    (4xx), CaptureFileError (an answer that names no file)."""
    try:
        response = client.post(f"{engine.url}/v1/completions", json=prefill_body(engine, sequence))
    except httpx.HTTPError as e:
        raise EngineUnavailable(f"{type(e).__name__}: {e}") from None
    if response.status_code >= 500:
        raise EngineUnavailable(f"HTTP {response.status_code}: {error_message(response)}")
    if response.status_code >= 400:
        raise EngineRefused(f"the engine refused the prefill (HTTP {response.status_code}): {error_message(response)}")
    written = written_file(response.json(), files)
    if written is None:
        raise CaptureFileError(
            "the engine's answer names no hidden_states_path: launch it with the extract_hidden_states "
            "speculative method and the hidden-states KV connector"
        )
    return written


class EngineCapturer:
    """Captures the layers `launch` names, on the engine, through the files it writes under `files`.

    Sequences of a batch are sent together (up to `concurrency` in flight) so that the engine batches
    them. An engine that does not answer raises EngineUnavailable, and one that answers but writes no
    file CaptureLost (either way the batch waits for it); a refused request or a wrong file fails its
    sequence alone."""

    def __init__(
        self,
        engine: Engine,
        launch: EngineLaunch,
        heads: Heads,
        *,
        files: Path,
        num_layers: int,
        hidden_size: int,
        timeout_s: float,
        concurrency: int,
        orphan_after_s: float = 600.0,
    ) -> None:
        """`files`: the engine connector's directory as mounted here; its files older than `orphan_after_s`
        (a capture lease) that no capture took are deleted."""
        self.engine, self.launch, self.heads = engine, launch, heads
        self._orphan_after_s = orphan_after_s
        self.info = launch.capture
        self.layers: frozenset[int] | None = frozenset(launch.layers)
        self._files, self._last, self._hidden_size = files, num_layers - 1, hidden_size
        self._client = httpx.Client(
            timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        )
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="engine-capture")

    def close(self) -> None:
        """Close the connections and the request threads."""
        self._pool.shutdown(wait=True)
        self._client.close()

    def capture(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_lens: Sequence[int],
        layers: Sequence[int],
        samplings: Sequence[SamplingParams | None] | None = None,
    ) -> list[Captured | Exception]:
        """Per sequence: its `layers` from the engine's file and how its response agrees with the target
        (through the heads, from the last layer); EngineUnavailable when the engine did not answer,
        CaptureLost (naming the sequence) when it answered but wrote no file."""
        missing = set(layers) - set(self.launch.layers)
        if missing:
            raise ValueError(f"layers {sorted(missing)} are not among the engine's {list(self.launch.layers)}")
        sweep_capture_files(self._files, self._orphan_after_s)
        settings = samplings if samplings is not None else [None] * len(sequences)
        jobs = [
            self._pool.submit(self._one, list(s), p, layers, m)
            for s, p, m in zip(sequences, prompt_lens, settings, strict=True)
        ]
        results: list[Captured | Exception] = []
        for i, job in enumerate(jobs):
            try:
                results.append(job.result())
            except (EngineUnavailable, CaptureFileMissing) as e:
                for rest in jobs:
                    rest.cancel()
                if isinstance(e, CaptureFileMissing):
                    raise CaptureLost(str(e), index=i) from None
                raise
            except (EngineError, CaptureFileError, ValueError) as e:
                results.append(e)
        return results

    def _one(
        self, sequence: list[int], prompt_len: int, layers: Sequence[int], sampling: SamplingParams | None
    ) -> Captured:
        path = prefill(self._client, self.engine, sequence, self._files)
        launch, hidden = take_capture_file(path, sequence, self._hidden_size)  # [T, n_aux, H]
        if launch != self.launch:
            raise CaptureFileError(
                f"{path} was written by an engine launched otherwise ({launch}) than at startup ({self.launch})"
            )
        column = {k: i for i, k in enumerate(launch.layers)}
        misses = self.heads.response_misses(hidden[:, column[self._last]], torch.tensor(sequence), prompt_len, sampling)
        return Captured.of({k: hidden[:, column[k]] for k in layers}, misses, sampling)
