"""The doctor's normed reading: the served last layer through the target's final norm equals HF's last
`hidden_states` entry, the ground truth a trainer reading HF's hidden states trained on; its table gives
each reading's tau both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cache_server.client import TargetHeads
from cache_server.torch_utils import as_numpy
from eval_worker.evaluation.doctor import NormedLayer, Reading, format_doctor
from eval_worker.reports.conventions import TAU_LEGEND
from schemas.model import ModelInfo
from testing.tiny_trainer import Sequences
from tests.eval_worker.evaluation.test_evaluate import TinySource


def test_the_normed_reading_is_hfs_last_hidden_states_entry(
    target: Any, target_info: ModelInfo, sequences: Sequences
) -> None:
    source = TinySource(target, target_info, sequences)
    norm = target.model.norm
    heads = TargetHeads(np.zeros((1, 1)), np.zeros((1, 1)), "fp", as_numpy(norm.weight.detach()), norm.variance_epsilon)
    last = target_info.num_layers - 1
    normed = NormedLayer(source, last, heads).hidden("p0", [1, last])
    raw = source.hidden("p0", [1, last])
    ids = torch.from_numpy(sequences.token_ids[0].numpy())[None]
    with torch.no_grad():
        hf_last = target(ids, output_hidden_states=True).hidden_states[-1][0]
    h = target_info.hidden_size
    assert np.array_equal(normed.hidden[:, :h], raw.hidden[:, :h])  # other layers as served
    assert torch.equal(torch.from_numpy(normed.hidden[:, h:]), hf_last)
    assert not torch.equal(torch.from_numpy(raw.hidden[:, h:]), hf_last)


def test_each_reading_shows_per_prompt_and_pooled_tau() -> None:
    readings = [Reading("declared", (0, 2, 4), 2.193, pooled_tau=1.875), Reading("one layer later", (1, 3, 5), None)]
    lines = format_doctor(Path("ckpt"), readings).splitlines()
    assert lines[1].split() == ["reading", "layers", "per-prompt", "pooled"]
    assert lines[2].split()[-2:] == ["2.193", "1.875"] and lines[3].split()[-2:] == ["-", "-"]
    assert lines[-1] == TAU_LEGEND
