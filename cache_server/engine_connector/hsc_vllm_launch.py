"""`python3 hsc_vllm_launch.py --capture-layers all|1,16,31 --engine-files DIR [vLLM server flags]`:
vLLM's OpenAI server with engine capture on, the aux ids derived from the cache server's own
`--capture-layers` (so the two cannot disagree by the off-by-one of the layer conventions).

Runs in the engine's environment beside `hsc_vllm_connector.py` (standard library only): it puts this
directory on PYTHONPATH, adds the capture flags and execs the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def num_layers(model_dir: Path) -> int:
    """The target's decoder layers, from its `config.json` (a multimodal one's `text_config`)."""
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("text_config", config)["num_hidden_layers"])


def aux_layer_ids(capture_layers: str, layers: int) -> list[int]:
    """vLLM aux ids for `--capture-layers` ('all' or '1,16,31'): this project's layer k (the output of
    decoder layer k) is HF `hidden_states[k + 1]`, which is what vLLM's aux id k + 1 taps."""
    text = capture_layers.strip()
    ids = list(range(layers)) if text == "all" else [int(part) for part in text.split(",")]
    bad = [k for k in ids if not 0 <= k < layers]
    if bad or not ids or len(set(ids)) != len(ids):
        raise ValueError(f"--capture-layers {capture_layers!r}: want 'all' or distinct ids in 0..{layers - 1}")
    return [k + 1 for k in ids]


def engine_flags(
    aux_ids: Sequence[int],
    shared_dir: Path,
    *,
    module: str = "hsc_vllm_connector",
    connector: str = "HiddenStatesConnector",
) -> list[str]:
    """vLLM flags: `extract_hidden_states` over `aux_ids`, each request's file written into `shared_dir`
    by `connector` from `module`. Prefix caching is off: a cached prefix is never recomputed, so its
    hidden states would never be written."""
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in aux_ids]}},
    }
    transfer = {
        "kv_connector": connector,
        "kv_connector_module_path": module,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(shared_dir)},
    }
    return [
        "--speculative-config",
        json.dumps(speculative),
        "--kv-transfer-config",
        json.dumps(transfer),
        "--no-enable-prefix-caching",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse our two flags, pass the rest to vLLM, exec it."""
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--capture-layers", required=True, help="'all' or the cache server's layer ids")
    parser.add_argument("--engine-files", type=Path, required=True, help="the directory shared with the server")
    parser.add_argument("--model", type=Path, required=True, help="the target's model directory")
    args, rest = parser.parse_known_args(argv)
    aux_ids = aux_layer_ids(args.capture_layers, num_layers(args.model))
    args.engine_files.mkdir(parents=True, exist_ok=True)
    try:
        # The cache server runs as another user in another container and deletes each file it ingests.
        args.engine_files.chmod(0o777)
    except PermissionError:
        print(f"cannot chmod {args.engine_files}: the cache server must be able to delete files in it", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(HERE), os.environ.get("PYTHONPATH")] if p)}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model), *rest]
    os.execve(sys.executable, [*cmd, *engine_flags(aux_ids, args.engine_files)], env)


if __name__ == "__main__":
    main()
