from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from cache_server.client import HiddenResult, TargetHeads
from eval_worker.errors import FeatureMismatch
from eval_worker.evaluation.heads_cache import HeadsCache
from schemas.model import ModelInfo


class HeadsOnly:
    def __init__(self, fingerprint: str) -> None:
        self.fingerprint, self.calls = fingerprint, 0

    def model(self) -> ModelInfo:
        raise NotImplementedError

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        raise NotImplementedError

    def heads(self) -> TargetHeads:
        self.calls += 1
        torch.manual_seed(0)
        return TargetHeads(torch.randn(10, 4).numpy(), torch.randn(10, 4).numpy(), self.fingerprint)


def test_fetch_once_then_read_from_disk(tmp_path: Path) -> None:
    source, cache = HeadsOnly("abc123"), HeadsCache(tmp_path)
    first = cache.get(source, "abc123")
    second = cache.get(source, "abc123")
    assert source.calls == 1
    assert (first.lm_head == second.lm_head).all() and second.fingerprint == "abc123"


def test_unsafe_fingerprints_are_hashed_into_the_file_name(tmp_path: Path) -> None:
    path = HeadsCache(tmp_path).path_for("../../etc/passwd")
    assert path.parent == tmp_path and len(path.stem) == 64


def test_a_corrupt_cache_file_is_refetched(tmp_path: Path) -> None:
    source, cache = HeadsOnly("abc"), HeadsCache(tmp_path)
    cache.path_for("abc").write_bytes(b"not safetensors")
    assert cache.get(source, "abc").embed_tokens.shape == (10, 4)
    assert source.calls == 1
    cache.get(source, "abc")
    assert source.calls == 1


def test_heads_of_another_target_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FeatureMismatch, match="heads are for target 'other'"):
        HeadsCache(tmp_path).get(HeadsOnly("other"), "abc")
