"""An engine that answers a prefill but never writes its capture file (it died between the two) leaves
the prompt pending, spending one of its capture attempts: captured once the engine writes again, or
failed, saying so, once every attempt lost its file; at startup, a lost probe file refuses the start.
The engine is a fake on loopback that writes the files the project's connector would, the states from
a direct forward; the capture path is the server's."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi import FastAPI, Response
from pydantic import BaseModel
from safetensors.torch import save_file

from cache_server.api.app import create_app
from cache_server.capture.heads import Heads
from cache_server.capture.target import ModelShape, Target, target_info
from cache_server.client import CacheClient, PromptFailedError
from cache_server.compute.instances import DEFAULT_DB_FILE
from cache_server.compute.metrics import Metrics
from cache_server.compute.service import HiddenStateService
from cache_server.coordination.database import Database
from cache_server.generation.capture_files import FILE_FORMAT, EngineLaunch
from cache_server.generation.engine import Engine, EngineUnfit
from cache_server.generation.engine_capture import EngineCapturer
from cache_server.generation.engine_target import open_engine_target
from cache_server.store.hidden_store import HiddenStore
from testing.servers import serving_app
from tests.cache_server.helpers import serve_settings
from tests.cache_server.reference import direct_layer_outputs

MARKER = 3  # the fake engine's faults hit the prompt whose first token id this is
RIGHT = {"token_ids": [20, 21, 22, 23, 24], "response_token_ids": [30, 31]}
LOST = {"token_ids": [MARKER, 40, 41, 42], "response_token_ids": [50]}


class Prefill(BaseModel):
    """What the fake engine reads of a completions body."""

    prompt: list[int]


class FakeEngine:
    """`POST /v1/completions` of a capturing engine: each prefill answered with its file, written into
    `files` as the project's connector writes it (lock first, then the states of every layer), except
    that the prefills of the prompt starting with `marker` (of every prompt: None) follow `script`:
    "lost" answers without writing, "away" answers 503 (the engine down); once `script` is spent they
    are written too."""

    def __init__(self, model: Path, files: Path, script: list[str], marker: int | None = MARKER) -> None:
        self.model, self.files, self.script, self.marker = model, files, script, marker
        self.launch = EngineLaunch(tuple(range(1, ModelShape.of(model).num_layers + 1)), "float32", 1, 1, "0.32.0")
        self._requests = itertools.count()  # requests run in threads at once
        self._forwards: dict[tuple[int, ...], torch.Tensor] = {}

    def _states(self, ids: tuple[int, ...]) -> torch.Tensor:
        """A direct forward's states of every layer, once per sequence (a retried one asks again)."""
        if ids not in self._forwards:
            self._forwards[ids] = torch.stack(direct_layer_outputs(self.model, ids), dim=1)
        return self._forwards[ids]

    def app(self) -> FastAPI:
        app = FastAPI()
        app.post("/v1/completions", response_model=None)(self.complete)
        return app

    def complete(self, body: Prefill) -> dict[str, object] | Response:
        ids = body.prompt
        step = self.script.pop(0) if self.marker in (None, ids[0]) and self.script else "write"
        if step == "away":
            return Response(status_code=503)
        path = self.files / f"req-{next(self._requests)}.safetensors"
        Path(f"{path}.lock").touch()  # before the answer, as vLLM's connector takes it
        if step == "write":
            hidden = self._states(tuple(ids))  # [T, n_aux, H]
            metadata = {
                "format": FILE_FORMAT,
                "aux_layer_ids": json.dumps(list(self.launch.aux_layer_ids)),
                "dtype": "float32",
                "tensor_parallel_size": "1",
                "pipeline_parallel_size": "1",
                "vllm_version": "0.32.0",
                "model": "tiny",
            }
            save_file({"hidden_states": hidden, "token_ids": torch.tensor(ids)}, path, metadata=metadata)
        return {"choices": [{"token_ids": [0]}], "kv_transfer_params": {"hidden_states_path": str(path)}}


@contextmanager
def _served(model: Path, tmp_path: Path, script: list[str], attempts: int) -> Iterator[tuple[CacheClient, FakeEngine]]:
    """A cache server capturing on the fake engine, each prompt tried `attempts` times at most."""
    files = tmp_path / "engine-files"
    files.mkdir()
    engine = FakeEngine(model, files, script)
    with serving_app(engine.app()) as engine_url:
        shape = ModelShape.of(model)
        heads = Heads.from_checkpoint(model, torch.float32)
        capturer = EngineCapturer(
            Engine(engine_url, "tiny", "0.32.0", ()),
            engine.launch,
            heads,
            files=files,
            num_layers=shape.num_layers,
            hidden_size=shape.hidden_size,
            timeout_s=30,
            concurrency=4,
        )
        target = Target(target_info(model, shape, capturer, "exact"), shape.tokenizer(model), heads, capturer, None)
        store = tmp_path / "store"
        service = HiddenStateService(
            target,
            HiddenStore(
                store, fingerprint=target.info.fingerprint, model_name="tiny", hidden_size=64, dtype=torch.float32
            ),
            capture_layers=list(range(shape.num_layers)),
            metrics=Metrics(),
            db=Database(str(tmp_path / DEFAULT_DB_FILE)),
            capture_attempts=attempts,
        )
        app = create_app(serve_settings(model, store), build=lambda _settings: service)
        with serving_app(app) as url, CacheClient(url) as client:
            yield client, engine


def test_a_file_lost_while_the_engine_died_is_captured_once_it_is_back(tiny_target: Path, tmp_path: Path) -> None:
    # Two losses in three attempts: the engine's absence between them spends none.
    with _served(tiny_target, tmp_path, ["lost", "away", "lost"], attempts=3) as (client, engine):
        ids = [p.prompt_id for p in client.register([RIGHT, LOST])]
        client.wait_ready(ids, timeout_s=60)
        for pid, spec in zip(ids, (RIGHT, LOST), strict=True):
            tokens = spec["token_ids"] + spec["response_token_ids"]
            direct = torch.cat(direct_layer_outputs(tiny_target, tokens), dim=-1).numpy()
            np.testing.assert_array_equal(client.hidden(pid, range(6)).hidden, direct)
    assert engine.script == []  # both losses and the engine's absence were lived through
    assert list((tmp_path / "engine-files").iterdir()) == []  # every file taken, and every lock, deleted


def test_a_file_the_engine_never_writes_fails_its_prompt_after_the_last_attempt(
    tiny_target: Path, tmp_path: Path
) -> None:
    with _served(tiny_target, tmp_path, ["lost"] * 2, attempts=2) as (client, _engine):
        right, lost = (p.prompt_id for p in client.register([RIGHT, LOST]))
        client.wait_ready([right], timeout_s=60)
        with pytest.raises(PromptFailedError) as failed:
            client.wait_ready([lost], timeout_s=60)
        error = client.prompt(lost).error
    assert error is not None and error.startswith("CaptureFileMissing: given up after 2 attempts: the engine answered")
    assert "wrote no capture file" in str(failed.value)


def test_a_probe_capture_whose_file_is_lost_refuses_the_start(tiny_target: Path, tmp_path: Path) -> None:
    files = tmp_path / "engine-files"
    files.mkdir()
    engine = FakeEngine(tiny_target, files, ["write", "write", "lost"], marker=None)  # generate, prefill, capture
    with serving_app(engine.app()) as url, pytest.raises(EngineUnfit) as refused:
        open_engine_target(
            tiny_target,
            Engine(url, "tiny", None, ()),
            files=files,
            capture_layers=range(6),
            storage="exact",
            timeout_s=30,
            concurrency=1,
            orphan_after_s=600,
        )
    assert "the probe capture failed: the engine answered, but wrote no capture file" in str(refused.value)
