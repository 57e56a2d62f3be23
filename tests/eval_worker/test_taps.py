from __future__ import annotations

from typing import Any

import torch

from testing.taps import target_forward


def test_taps_follow_the_layer_convention(target: Any) -> None:
    ids = torch.tensor([[3, 50, 70, 90, 110, 130]])
    n, h = target.config.num_hidden_layers, target.config.hidden_size
    taps = target_forward(target, ids, list(range(n))).taps[0]  # [T, n*H]
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    for k in range(n - 1):
        torch.testing.assert_close(taps[:, k * h : (k + 1) * h], hs[k + 1][0])
    last = taps[:, (n - 1) * h :]
    assert not torch.allclose(last, hs[n][0])  # HF's last entry is after the final norm
    torch.testing.assert_close(target.model.norm(last), hs[n][0])


def test_taps_are_concatenated_in_request_order(target: Any) -> None:
    ids = torch.tensor([[3, 50, 70]])
    h = target.config.hidden_size
    forward = target_forward(target, ids, [4, 1]).taps[0]
    reverse = target_forward(target, ids, [1, 4]).taps[0]
    assert torch.equal(forward[:, :h], reverse[:, h:])
