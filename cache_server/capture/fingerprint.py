"""A target's identity: config, weight bytes, runtime dtype, tokenizer, how states are computed (the
server's forward or the engine's) and how they are stored, hashed into one id.

The store is namespaced by it, so a different model, checkpoint, dtype, capture or storage never reads
old states.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# Bumped whenever stored states would change meaning (layer convention, capture code).
STORE_FORMAT_VERSION = "1"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def _hash_file(h: hashlib._Hash, path: Path) -> None:
    with path.open("rb") as f:
        h.update(hashlib.file_digest(f, "sha256").digest())


def target_fingerprint(model_dir: Path, dtype_name: str, storage: str = "exact", capture: str = "") -> str:
    """sha256 over config.json (canonical), every weight file's bytes, tokenizer files, dtype, a
    storage other than exact (an exact store keeps the id it had before storages existed) and an
    engine capture's `CaptureInfo.fingerprint_part` (`capture`; empty for the server's own forward).

    Weight files are hashed in full: it costs one sequential read, cheaper than serving a stale cache.
    """
    h = hashlib.sha256()
    h.update(f"format={STORE_FORMAT_VERSION};dtype={dtype_name};".encode())
    if storage != "exact":
        h.update(f"storage={storage};".encode())
    h.update(capture.encode())
    config = json.loads((model_dir / "config.json").read_text())
    h.update(json.dumps(config, sort_keys=True).encode())
    weights = sorted(p for p in model_dir.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if not weights:
        raise FileNotFoundError(f"no weight files ({', '.join(_WEIGHT_SUFFIXES)}) in {model_dir}")
    for path in weights:
        h.update(path.name.encode())
        _hash_file(h, path)
    for name in _TOKENIZER_FILES:
        path = model_dir / name
        if path.exists():
            h.update(name.encode())
            _hash_file(h, path)
    return h.hexdigest()[:32]
