"""A real vLLM OpenAI-compatible server on loopback, from the engine's own virtual environment
(`.venv-vllm` or `$HSC_VLLM_VENV`, built by `./dev test`), for the tests that generate through an engine,
and the flags that make it write each prefill's hidden states to files (`capture_flags`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cache_server.engine_connector.hsc_vllm_launch import engine_flags
from testing.servers import wait_healthy

REPO = Path(__file__).resolve().parents[1]
CONNECTOR_DIR = REPO / "cache_server" / "engine_connector"  # on the engine's PYTHONPATH for capture
FAULTS_DIR = REPO / "testing" / "engine_faults"  # connectors that misbehave, beside CONNECTOR_DIR
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "2",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def vllm_python() -> Path | None:
    """The engine environment's interpreter (in `HSC_VLLM_VENV`, else `.venv-vllm`), if it is built."""
    path = Path(os.environ.get("HSC_VLLM_VENV", REPO / ".venv-vllm")) / "bin" / "python"
    return path if path.exists() else None


def capture_flags(
    aux_layer_ids: Sequence[int],
    shared_dir: Path,
    *,
    connector_dir: Path | None = None,
    module: str = "hsc_vllm_connector",
    connector: str = "HiddenStatesConnector",
) -> list[str]:
    """The engine flags for capture: `extract_hidden_states` over vLLM aux ids `aux_layer_ids` (HF
    `hidden_states` indices: the project's layer + 1), each request's file written into `shared_dir` by
    `connector` from `module`, which must be on `VllmServer`'s `pythonpath` (given `connector_dir`, the
    module is checked to be there now rather than when the engine fails to start a minute later).
    Prefix caching is off: a cached prefix is never recomputed, so its hidden states are never written."""
    if connector_dir is not None and not (connector_dir / f"{module}.py").is_file():
        raise FileNotFoundError(f"no {module}.py in {connector_dir}")
    return engine_flags(aux_layer_ids, shared_dir, module=module, connector=connector)


class VllmServer:
    """`vllm.entrypoints.openai.api_server` over `model` on a fixed loopback port; can be killed and
    started again on the same port (the engine going away under a running cache server). `pythonpath`
    goes first on the engine's PYTHONPATH (where a KV connector module is found)."""

    def __init__(self, model: Path, port: int, log: Path, *extra: str, pythonpath: Sequence[Path] = ()) -> None:
        python = vllm_python()
        if python is None:
            raise RuntimeError("the vLLM environment .venv-vllm is missing: ./dev test builds it")
        self.url = f"http://127.0.0.1:{port}"
        self._cmd = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "512",
            *extra,
        ]
        self._env = dict(VLLM_ENV)
        if pythonpath:
            paths = [str(p) for p in pythonpath] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]
            self._env["PYTHONPATH"] = os.pathsep.join(paths)
        self._log = log
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 240.0) -> None:
        """Start the engine and wait until `GET /health` answers 200."""
        with self._log.open("ab") as out:
            self._proc = subprocess.Popen(
                self._cmd, env={**os.environ, **self._env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_healthy(self.url, self._proc, self._log, timeout_s, path="/health")

    def kill(self) -> None:
        """SIGKILL the engine and its workers (its process group), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, 9)
            self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s."""
        if self._proc is None or self._proc.poll() is not None:
            return
        os.killpg(self._proc.pid, 15)
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
        self._proc = None
