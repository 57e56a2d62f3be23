"""The evaluation loop against an in-process feature source built on the tiny target."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cache_server.client import HiddenResult, TargetHeads
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.errors import CheckpointRefused, FeatureMismatch
from eval_worker.evaluation.evaluate import evaluate
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.walk_types import DeviceHeads
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.walks import CHAIN
from schemas.eval_spec import DFlashOptions
from schemas.hidden import HiddenMetadata
from schemas.layers import LAYER_CONVENTION
from schemas.model import ModelInfo
from schemas.report import DFlashDrafting, EvalReport
from testing.all_anchor import all_anchor_taus
from testing.checkpoints import save_hf_checkpoint, save_torch_checkpoint
from testing.live_loop import target_heads
from testing.taps import target_forward
from testing.tensors import as_numpy
from testing.tiny_trainer import Sequences
from tests.eval_worker.helpers import BLOCK_SIZE, LAYER_IDS


class TinySource:
    """A FeatureSource that runs the tiny target in-process (what the cache server would serve)."""

    def __init__(self, target: Any, info: ModelInfo, sequences: Sequences) -> None:
        self.target, self.info = target, info
        self.prompts = {
            f"p{i}": (ids, n) for i, (ids, n) in enumerate(zip(sequences.token_ids, sequences.prompt_lens, strict=True))
        }
        self.heads_calls = 0
        self.requests: list[list[int]] = []

    def model(self) -> ModelInfo:
        return self.info

    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        self.requests.append(list(layers))
        ids, prompt_len = self.prompts[prompt_id]
        taps = target_forward(self.target, ids[None], layers).taps[0]
        meta = HiddenMetadata(
            prompt_id=prompt_id,
            layers=list(layers),
            layer_convention=LAYER_CONVENTION,
            model_fingerprint=self.info.fingerprint,
            hidden_size=self.info.hidden_size,
            prompt_len=prompt_len,
            start=0,
            stop=int(ids.shape[0]),
            dtype="float32",
        )
        return HiddenResult(as_numpy(taps), as_numpy(ids.clone()), meta)

    def heads(self) -> TargetHeads:
        self.heads_calls += 1
        embed, lm_head = target_heads(self.target)
        return TargetHeads(as_numpy(embed.clone()), as_numpy(lm_head.clone()), self.info.fingerprint)


@pytest.fixture
def source(target: Any, target_info: ModelInfo, sequences: Sequences) -> TinySource:
    return TinySource(target, target_info, sequences)


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, trained_drafter: DFlashDrafter, target_info: ModelInfo
) -> LoadedCheckpoint:
    path = save_hf_checkpoint(tmp_path_factory.mktemp("ckpt") / "hf", trained_drafter)
    return load_checkpoint(path, target_info)


def _evaluate(source: TinySource, ckpt: LoadedCheckpoint, cache_dir: Path, **options: Any) -> EvalReport:
    opts = EvalOptions(progress=False, **options)
    return evaluate(source, ckpt, list(source.prompts), heads_cache=HeadsCache(cache_dir), options=opts)


def test_report_matches_the_offline_walk(
    source: TinySource, checkpoint: LoadedCheckpoint, target: Any, sequences: Sequences, tmp_path: Path
) -> None:
    treed = dataclasses.replace(checkpoint, options=DFlashOptions(tree_budgets=[2, 6]))  # trees: the checkpoint's
    report = _evaluate(source, treed, tmp_path, max_blocks=5, group_tokens=90)
    embed, head = target_heads(target)
    for prompt, ids, taps, n in zip(
        report.prompts, sequences.token_ids, sequences.taps, sequences.prompt_lens, strict=True
    ):
        expected = all_anchor_taus(checkpoint.drafter, taps, ids.tolist(), n, (2, 6), embed, head)
        assert prompt.chain.round_taus == expected[CHAIN]
        assert {b: t.round_taus for b, t in prompt.trees.items()} == {2: expected[2], 6: expected[6]}
    means = [p.chain.mean for p in report.prompts]
    assert report.summary.chain.mean_tau == pytest.approx(sum(m for m in means if m) / len(means))
    rounds = [t for p in report.prompts for t in p.chain.round_taus]
    assert report.summary.chain.tokens_per_round == pytest.approx(sum(rounds) / len(rounds))
    assert sum(report.summary.chain.histogram.values()) == len(rounds) == report.summary.chain.total_rounds
    assert report.summary.chain.mean_tau is not None and report.summary.chain.mean_tau > 1.3
    assert (report.target_layer_ids, report.layer_ids_source, report.format) == (
        [1, 3, 5],
        "checkpoint",
        "hf_dir",
    )
    assert (report.target_fingerprint, report.dtype) == ("tiny-fp", "float32")
    mask = checkpoint.drafter.cfg.mask_token_id
    assert report.drafting == DFlashDrafting(block_size=BLOCK_SIZE, mask_token_id=mask, tree_budgets=[2, 6])
    assert set(report.summary.trees) == {2, 6}
    assert EvalReport.model_validate_json(report.model_dump_json()) == report
    cost = report.summary.cost
    assert cost is not None
    all_rounds = report.summary.chain.total_rounds + sum(t.total_rounds for t in report.summary.trees.values())
    assert 0 < cost.drafted_blocks <= all_rounds
    assert 0 < cost.lm_head_rows <= all_rounds * (BLOCK_SIZE - 1)  # what the live loops would project
    taps_bytes = sum(len(ids) * 3 * 64 * 4 + len(ids) * 8 for ids in sequences.token_ids)  # fp32 taps + int64 ids
    assert (cost.feature_bytes_fetched, cost.feature_cache_hits) == (taps_bytes, 0)
    assert min(cost.seconds.fetch, cost.seconds.draft, cost.seconds.walk) >= 0 < cost.seconds.draft


def test_hf_and_torch_checkpoints_score_the_same(
    source: TinySource, trained_drafter: DFlashDrafter, target_info: ModelInfo, tmp_path: Path
) -> None:
    hf = load_checkpoint(save_hf_checkpoint(tmp_path / "hf", trained_drafter, layout="top_level"), target_info)
    pt_path = save_torch_checkpoint(tmp_path / "c.pt", trained_drafter, global_step=120, epoch=1)
    pt = load_checkpoint(pt_path, target_info)
    a, b = _evaluate(source, hf, tmp_path), _evaluate(source, pt, tmp_path)
    assert [p.chain for p in a.prompts] == [p.chain for p in b.prompts]
    assert (b.format, b.step, b.epoch) == ("torch_dict", 120, 1)


def test_requested_layers_come_from_the_checkpoint_and_are_logged(
    source: TinySource, checkpoint: LoadedCheckpoint, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="eval_worker"):
        _evaluate(source, checkpoint, tmp_path)
    assert source.requests == [list(LAYER_IDS)] * len(source.prompts)
    assert "requesting target layers [1, 3, 5] for 8 prompts (source: checkpoint" in caplog.text


def test_heads_are_cached_by_fingerprint(source: TinySource, checkpoint: LoadedCheckpoint, tmp_path: Path) -> None:
    first = _evaluate(source, checkpoint, tmp_path)
    assert (tmp_path / "tiny-fp.safetensors").is_file()
    second = _evaluate(source, checkpoint, tmp_path)
    assert source.heads_calls == 1
    assert [p.chain for p in first.prompts] == [p.chain for p in second.prompts]


class WrongLayers(TinySource):
    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        res = super().hidden(prompt_id, [layers[1], layers[0], layers[2]])
        return res


class OtherTarget(TinySource):
    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        res = super().hidden(prompt_id, layers)
        return HiddenResult(res.hidden, res.token_ids, res.metadata.model_copy(update={"model_fingerprint": "x"}))


class FourTaps(TinySource):
    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        res = super().hidden(prompt_id, [*layers, 0])
        return HiddenResult(res.hidden, res.token_ids, res.metadata.model_copy(update={"layers": list(layers)}))


class Slice(TinySource):
    def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
        res = super().hidden(prompt_id, layers)
        return HiddenResult(res.hidden[:-2], res.token_ids[:-2], res.metadata.model_copy(update={"stop": 5}))


@pytest.mark.parametrize(
    ("fake", "error", "message"),
    [
        (WrongLayers, FeatureMismatch, r"requested layers \[1, 3, 5\], the cache served \[3, 1, 5\]"),
        (OtherTarget, FeatureMismatch, "features are from target 'x'"),
        (FourTaps, CheckpointRefused, r"served features have shape \[\d+, 256\].*reads 3 layers .* 192 per token"),
        (Slice, FeatureMismatch, "need the whole sequence"),
    ],
)
def test_mismatched_features_stop_the_run(
    fake: type[TinySource],
    error: type[Exception],
    message: str,
    target: Any,
    target_info: ModelInfo,
    sequences: Sequences,
    checkpoint: LoadedCheckpoint,
    tmp_path: Path,
) -> None:
    with pytest.raises(error, match=message):
        _evaluate(fake(target, target_info, sequences), checkpoint, tmp_path)


def test_a_different_target_is_refused_before_any_fetch(
    target: Any, target_info: ModelInfo, sequences: Sequences, checkpoint: LoadedCheckpoint, tmp_path: Path
) -> None:
    bigger = target_info.model_copy(update={"num_layers": 8, "fingerprint": "other"})
    source = TinySource(target, bigger, sequences)
    with pytest.raises(CheckpointRefused, match="6-layer target"):
        _evaluate(source, checkpoint, tmp_path)
    assert source.heads_calls == 0 and source.requests == []


def test_bf16_features_are_evaluated_in_float32(
    source: TinySource, checkpoint: LoadedCheckpoint, tmp_path: Path
) -> None:
    class Bf16(TinySource):
        def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
            res = super().hidden(prompt_id, layers)
            hidden = torch.from_numpy(res.hidden).to(torch.bfloat16)
            return HiddenResult(as_numpy(hidden), res.token_ids, res.metadata)

    report = _evaluate(Bf16(source.target, source.info, _sequences_of(source)), checkpoint, tmp_path)
    assert report.summary.chain.total_rounds > 0


def _sequences_of(source: TinySource) -> Sequences:
    ids = [v[0] for v in source.prompts.values()]
    return Sequences(ids, [torch.empty(0)] * len(ids), [v[1] for v in source.prompts.values()])


def test_responses_that_are_not_target_greedy_are_counted_and_flagged(
    source: TinySource, checkpoint: LoadedCheckpoint, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class GivenResponse(TinySource):
        def hidden(self, prompt_id: str, layers: Sequence[int]) -> HiddenResult:
            res = super().hidden(prompt_id, layers)
            mismatches = 3 if prompt_id == "p0" else 0
            return HiddenResult(
                res.hidden, res.token_ids, res.metadata.model_copy(update={"greedy_mismatches": mismatches})
            )

    given = GivenResponse(source.target, source.info, _sequences_of(source))
    with caplog.at_level(logging.WARNING):
        report = _evaluate(given, checkpoint, tmp_path)
    assert report.summary.prompts_not_target_greedy == 1
    assert [p.greedy_mismatches for p in report.prompts][:2] == [3, 0]
    assert "not the target's greedy continuation" in caplog.text and "p0" in caplog.text


def test_the_report_names_the_keys_loading_accepted_and_its_warnings(
    source: TinySource, checkpoint: LoadedCheckpoint, tmp_path: Path
) -> None:
    accepted = dataclasses.replace(checkpoint, inert_config_keys=("wandb_id",), warnings=("t2d ignored",))
    report = _evaluate(source, accepted, tmp_path)
    assert (report.inert_config_keys, report.warnings) == (["wandb_id"], ["t2d ignored"])
    assert (_evaluate(source, checkpoint, tmp_path).inert_config_keys, report.drafting.family) == ([], "dflash")


def test_the_final_norm_is_on_the_device_whenever_the_cache_serves_one() -> None:
    embed, lm_head = np.ones((4, 2), np.float32), np.ones((4, 2), np.float32)
    served = TargetHeads(embed, lm_head, "fp", np.full(2, 2.0, np.float32), 1e-6)
    heads = DeviceHeads.of(served, EvalOptions(progress=False))  # greedy drafting: the norm comes too
    assert heads.final_norm is not None and heads.norm().eps == 1e-6 and not heads.norm().zero_centered
    plain = TargetHeads(embed, lm_head, "fp")
    assert DeviceHeads.of(plain, EvalOptions()).final_norm is None
    with pytest.raises(FeatureMismatch, match="use --draft-sampling greedy"):
        DeviceHeads.of(plain, EvalOptions(draft_sampling="probabilistic"))
