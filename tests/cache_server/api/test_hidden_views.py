"""`/hidden` in the peers' terms: layer ids as HF `hidden_states` indices (`layer_convention=hf_index`)
and the target's last layer after its final norm (`final_norm=post`), against a direct transformers
forward; the metadata says what was asked; what the server cannot serve that way is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.torch_utils import rms_norm
from tests.cache_server.helpers import app_client, error_message, get_hidden, register_ready

TOKENS = [5, 17, 9, 99, 3, 41, 8, 12]
LAST = 5  # the 6-layer tiny target's last decoder output


@pytest.mark.parametrize("stream", [True, False])
def test_hf_index_and_post_norm_are_the_direct_forwards_hidden_states(
    tiny_target: Path, tmp_path: Path, stream: bool
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([TOKENS]), output_hidden_states=True).hidden_states  # post-norm last
    with app_client(tiny_target, tmp_path / "store", stream_hidden=stream) as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}], layer=LAST)
        tensors, meta = get_hidden(client, pid, "6,2", layer_convention="hf_index", final_norm="post")
        raw, raw_meta = get_hidden(client, pid, f"{LAST},1")
    assert (meta["layers"], meta["layer_convention"], meta["final_norm"]) == ("6,2", "hf_index", "post")
    assert "final_norm" not in raw_meta and raw_meta["layer_convention"] == "decoder_output_0based"
    served, stored = tensors["hidden"], raw["hidden"]
    h = model.config.hidden_size
    assert torch.equal(served[:, h:], stored[:, h:])  # hf_index 2 is decoder output 1, not normed
    norm = model.model.norm
    assert torch.equal(served[:, :h], rms_norm(stored[:, :h], norm.weight.detach(), norm.variance_epsilon, False))
    torch.testing.assert_close(served[:, :h], hf[-1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(served[:, h:], hf[2][0], rtol=1e-5, atol=1e-5)


def test_what_cannot_be_served_that_way_is_refused(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}])

        def refused(**params: object) -> str:
            return error_message(client.get("/hidden", params={"prompt_id": pid, **params}), 422, "invalid_layers")

        assert "does not name" in refused(layers="1,2", final_norm="post")
        assert "not pieces" in refused(layers=str(LAST), final_norm="post", encoding="pieces")
        assert "0 is the embeddings" in refused(layers="0,3", layer_convention="hf_index")
        assert "1..6" in refused(layers="7", layer_convention="hf_index")
        assert client.get("/hidden", params={"prompt_id": pid, "layers": "1", "final_norm": "pre"}).status_code == 422


def test_a_row_range_is_those_rows_of_the_whole_normed_body(tiny_target: Path, tmp_path: Path) -> None:
    with app_client(tiny_target, tmp_path / "store") as client:
        [pid] = register_ready(client, [{"token_ids": TOKENS}], layer=LAST)
        whole, _ = get_hidden(client, pid, f"{LAST},1", final_norm="post")
        part, meta = get_hidden(client, pid, f"{LAST},1", final_norm="post", start=3, stop=7)
    assert (meta["start"], meta["stop"]) == ("3", "7")
    assert torch.equal(part["hidden"], whole["hidden"][3:7])
