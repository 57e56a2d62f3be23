"""Training samples from a real cache server, in each peer trainer's schema, against a direct transformers
forward of the target: the aux layers, the last layer raw (speculators) or after the final norm
(SpecForge EAGLE-3), the token ids and the response mask; every sample once per epoch over ranks and
DataLoader workers; an epoch's seed reorders them; a prompt still being captured is waited for."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from cache_server.client.torch_dataset import HiddenStatesDataset
from schemas.layers import decoder_outputs
from testing.servers import running_server
from testing.taps import target_forward

pytestmark = pytest.mark.slow
PROMPTS = [[5 + i, 17, 3 + 2 * i, 99] for i in range(8)]
AUX = [1, 3, 4]  # decoder outputs of a 6-layer target


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("torch-dataset")
    target = build_tiny_model(tmp / "target", layers=6, hidden=64)
    with running_server(target, tmp / "store") as url, CacheClient(url) as client:
        specs = [{"token_ids": p, "sets": ["train"]} for p in PROMPTS]
        ids = [r.prompt_id for r in client.register(specs, max_new_tokens=6)]
        client.wait_ready(ids)
        yield url, target


def _by_tokens(samples: list[dict[str, torch.Tensor]]) -> dict[tuple[int, ...], dict[str, torch.Tensor]]:
    return {tuple(s["input_ids"].tolist()): s for s in samples}


def test_each_format_holds_what_a_direct_forward_computes(served) -> None:  # type: ignore[no-untyped-def]
    url, target = served
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    formats = {
        f: _by_tokens(list(HiddenStatesDataset(url, layers=AUX, format=f, set_name="train")))
        for f in ("speculators", "specforge-eagle3", "specforge-dflash")
    }
    assert all(len(samples) == len(PROMPTS) for samples in formats.values())
    for tokens, sample in formats["speculators"].items():
        ids = torch.tensor([tokens])
        with torch.no_grad():
            taps = target_forward(model, ids, [*AUX, 5]).taps[0]
            post_norm = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        h = model.config.hidden_size
        assert sample["input_ids"].dtype == torch.int64
        torch.testing.assert_close(sample["hidden_states"], taps[:, : 3 * h], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sample["verifier_last_hidden_states"], taps[:, 3 * h :], rtol=1e-5, atol=1e-5)
        response = [0] * len(PROMPTS[0]) + [1] * (len(tokens) - len(PROMPTS[0]))
        assert sample["loss_mask"].tolist() == response
        eagle3, dflash = formats["specforge-eagle3"][tokens], formats["specforge-dflash"][tokens]
        torch.testing.assert_close(eagle3["hidden_state"][0], post_norm, rtol=1e-5, atol=1e-5)
        assert torch.equal(eagle3["aux_hidden_state"][0], sample["hidden_states"])
        assert torch.equal(dflash["hidden_states"][0], sample["hidden_states"])
        assert eagle3["loss_mask"].tolist() == dflash["loss_mask"].tolist() == response


def test_two_ranks_of_two_workers_see_every_prompt_once_an_epoch(served) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    seen: Counter[tuple[int, ...]] = Counter()
    orders = []
    for rank in range(2):
        data = HiddenStatesDataset(
            url, layers=AUX, format="specforge-dflash", set_name="train", rank=rank, world_size=2
        )
        assert len(data) == len(PROMPTS) // 2
        # spawned workers, as speculators' loaders start them: a fork after torch's threads ran can hang
        for sample in DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn"):
            seen[tuple(sample["input_ids"].tolist()[: len(PROMPTS[0])])] += 1
        orders.append(data.epoch_order())
    assert seen == Counter({tuple(p): 1 for p in PROMPTS})
    assert orders[0] == orders[1]  # every rank shares the epoch's order
    data.set_epoch(1)
    assert data.epoch_order() != orders[0] and sorted(data.epoch_order()) == sorted(orders[0])


def test_a_prompt_still_being_captured_is_waited_for(served) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    with CacheClient(url) as client:
        [cold] = client.register([{"token_ids": [7, 8, 9, 10, 11]}], max_new_tokens=8)
    [sample] = list(HiddenStatesDataset(url, layers=AUX, format="speculators", prompt_ids=[cold.prompt_id]))
    assert sample["input_ids"].tolist()[:5] == [7, 8, 9, 10, 11] and len(sample["input_ids"]) == 13


def test_hf_index_ids_are_decoder_outputs_one_below() -> None:
    assert decoder_outputs([2, 4, 5], "hf_index") == [1, 3, 4]
    assert decoder_outputs([1, 3, 4], "decoder_output_0based") == [1, 3, 4]
    with pytest.raises(ValueError, match="0 is the embeddings"):
        decoder_outputs([0, 3], "hf_index")
    with pytest.raises(ValueError, match="layer_convention 'hf' is not one of: decoder_output_0based, hf_index"):
        decoder_outputs([2, 4, 5], "hf")  # type: ignore[arg-type]  # as an untyped caller might


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"format": "eagle3"}, "format 'eagle3' is not one of: speculators, specforge-eagle3, specforge-dflash"),
        ({"format": "Speculators"}, "format 'Speculators' is not one of"),
        ({"format": "speculators", "layer_convention": "hf"}, "layer_convention 'hf' is not one of"),
    ],
)
def test_an_option_outside_its_choices_is_refused_before_the_server_is_asked(
    options: dict[str, str], refusal: str
) -> None:
    # no server listens on port 9: the refusal comes before any connection
    with pytest.raises(ValueError, match=refusal):
        HiddenStatesDataset("http://127.0.0.1:9", layers=AUX, set_name="train", **options)  # type: ignore[arg-type]


def test_the_last_layer_as_an_aux_layer_is_fetched_once_and_bad_ids_refused(served) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    data = HiddenStatesDataset(url, layers=[1, 5], format="speculators", set_name="train")
    assert data.fetched == [1, 5]
    sample = next(iter(data))
    h = sample["verifier_last_hidden_states"].shape[1]
    assert torch.equal(sample["verifier_last_hidden_states"], sample["hidden_states"][:, h:])
    with pytest.raises(ValueError, match=r"outside the target's 0\.\.5"):
        HiddenStatesDataset(url, layers=[1, 6], format="speculators", set_name="train")
