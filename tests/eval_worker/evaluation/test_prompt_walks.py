"""The target's last layer split off the drafter's taps: only when it was fetched beside them, in order;
anything else served is left whole for the feature checks to refuse."""

from __future__ import annotations

import torch

from eval_worker.evaluation.feature_cache import Features
from eval_worker.evaluation.prompt_walks import split_last
from schemas.hidden import HiddenMetadata

H, T = 4, 3


def _served(layers: list[int]) -> Features:
    """Features whose column block k holds the value of its layer id, so every split is visible."""
    hidden = torch.cat([torch.full((T, H), float(k)) for k in layers], dim=1)
    meta = HiddenMetadata(
        prompt_id="p", layers=layers, layer_convention="decoder_output_0based", model_fingerprint="fp",
        hidden_size=H, prompt_len=1, start=0, stop=T, dtype="float32",
    )  # fmt: skip
    return Features(hidden, torch.arange(T), meta)


def test_the_last_layer_fetched_beside_the_taps_is_split_off() -> None:
    taps, last = split_last(_served([1, 3, 7]), [1, 3], 7)
    assert taps.metadata.layers == [1, 3] and taps.hidden.unique().tolist() == [1.0, 3.0]
    assert last is not None and last.unique().tolist() == [7.0] and last.shape == (T, H)


def test_a_drafter_reading_the_last_layer_keeps_its_taps_whole() -> None:
    served = _served([1, 3, 5])
    taps, last = split_last(served, [1, 3, 5], 5)
    assert taps is served and last is not None and last.unique().tolist() == [5.0]


def test_what_was_not_asked_for_is_left_for_the_checks() -> None:
    for served, layers in (([3, 1, 5], [1, 3, 5]), ([3, 1, 7], [1, 3]), ([1, 3], [1, 3])):
        features = _served(served)
        taps, _ = split_last(features, layers, 7 if 7 in served else 5)
        assert taps is features  # the layers it says, as served: check_features refuses a wrong order
