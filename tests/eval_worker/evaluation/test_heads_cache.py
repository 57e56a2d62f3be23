from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

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


class WithNorm(HeadsOnly):
    """Heads whose final norm is served, of either kind."""

    def __init__(self, fingerprint: str, zero_centered: bool) -> None:
        super().__init__(fingerprint)
        self.zero_centered = zero_centered

    def heads(self) -> TargetHeads:
        plain = super().heads()
        norm = np.array([0.5, -0.25, 0.0, 1.0], np.float32)
        return dataclasses.replace(
            plain, final_norm=norm, final_norm_eps=1e-6, final_norm_zero_centered=self.zero_centered
        )


@pytest.mark.parametrize("zero_centered", [True, False])
def test_the_final_norm_and_its_kind_are_kept(tmp_path: Path, zero_centered: bool) -> None:
    source, cache = WithNorm("abc", zero_centered), HeadsCache(tmp_path)
    cache.get(source, "abc")
    cached = cache.get(source, "abc")
    assert source.calls == 1
    assert cached.final_norm is not None and cached.final_norm.tolist() == [0.5, -0.25, 0.0, 1.0]
    assert cached.final_norm_eps == 1e-6 and cached.final_norm_zero_centered == zero_centered


@pytest.mark.parametrize("norm", [True, False], ids=["a norm", "no norm"])
def test_a_file_written_before_norms_had_kinds_is_refetched(tmp_path: Path, norm: bool) -> None:
    """Such a worker read every served norm as plain, and such a server served no zero-centred one."""
    source, cache = WithNorm("abc", zero_centered=True), HeadsCache(tmp_path)
    tensors = {"embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4)}
    if norm:
        tensors["norm.weight"] = torch.zeros(4)
    save_file(tensors, cache.path_for("abc"), {"fingerprint": "abc", "final_norm_eps": "1e-06" if norm else "none"})
    assert cache.get(source, "abc").final_norm_zero_centered and source.calls == 1
    assert cache.get(source, "abc").final_norm_zero_centered and source.calls == 1
