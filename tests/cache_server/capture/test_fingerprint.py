"""A target's fingerprint names everything that changes the stored states: weights, dtype, storage."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cache_server.capture.fingerprint import STORE_FORMAT_VERSION, target_fingerprint


def test_storage_is_part_of_the_fingerprint_and_exact_keeps_the_old_one(tiny_target: Path) -> None:
    exact = target_fingerprint(tiny_target, "bfloat16")
    assert target_fingerprint(tiny_target, "bfloat16", "exact") == exact
    assert target_fingerprint(tiny_target, "bfloat16", "float8_e4m3fn") != exact
    assert target_fingerprint(tiny_target, "float32", "float8_e4m3fn") != target_fingerprint(
        tiny_target, "bfloat16", "float8_e4m3fn"
    )
    # An exact store's id is what it was before storages existed: the same hash, recomputed here.
    h = hashlib.sha256(f"format={STORE_FORMAT_VERSION};dtype=bfloat16;".encode())
    h.update(json.dumps(json.loads((tiny_target / "config.json").read_text()), sort_keys=True).encode())
    for path in sorted(p for p in tiny_target.iterdir() if p.suffix == ".safetensors"):
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tiny_target / name).exists():
            h.update(name.encode())
            h.update(hashlib.sha256((tiny_target / name).read_bytes()).digest())
    assert exact == h.hexdigest()[:32]
