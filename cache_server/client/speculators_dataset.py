"""speculators' map-style training dataset over the cache: its `BaseDataset`, read by its own
`_setup_dataloader` and `Trainer` where its offline `ArrowDataset` goes. Needs speculators installed;
imported only by name (`import cache_server.client` never loads it).

    from cache_server.client.speculators_dataset import CacheDataset

    data = CacheDataset("http://cache:8000", layers=model.target_layer_ids, set_name="ultrachat", max_len=8192)

`layers` are speculators' own aux ids (HF `hidden_states` indices, `eagle_aux_hidden_state_layer_ids`);
the last layer (raw, before the final norm) comes with them. Packing lengths are the prompt listing's
`num_tokens`, known without fetching a hidden state; each sample is fetched when the loader asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from speculators.train.data import BaseDataset

from cache_server.client.cache import CacheClient
from cache_server.client.torch_dataset import HiddenStatesDataset
from schemas.layers import RequestLayerConvention
from schemas.prompts import PromptState


class CacheDataset(BaseDataset):  # type: ignore[misc]  # speculators is untyped to mypy
    """The prompts of a set (or the ids given), sample i being prompt i in that order: `input_ids`,
    `hidden_states` (the aux `layers` concatenated per token), `verifier_last_hidden_states`, `loss_mask`."""

    def __init__(
        self,
        server: str,
        *,
        layers: Sequence[int],
        max_len: int,
        set_name: str | None = None,
        prompt_ids: Sequence[str] | None = None,
        layer_convention: RequestLayerConvention = "hf_index",
        hidden_states_dtype: torch.dtype = torch.bfloat16,
        token: str | None = None,
        wait_s: float = 3600.0,
    ) -> None:
        if (set_name is None) == (prompt_ids is None):
            raise ValueError("name one of set_name or prompt_ids")
        with CacheClient(server, token=token) as client:
            listed = client.prompts(set_name=set_name)  # every prompt when no set is named
        ids, self.num_tokens = _ids_and_lengths(listed, prompt_ids, set_name)
        self.samples = HiddenStatesDataset(
            server,
            layers=layers,
            layer_convention=layer_convention,
            prompt_ids=ids,
            format="speculators",
            token=token,
            wait_s=wait_s,
        )
        self._client: CacheClient | None = None
        self._client_pid = -1
        # after the state above: BaseDataset.__init__ calls _compute_approx_lengths
        super().__init__(max_len, hidden_states_dtype)

    @property
    def prompt_ids(self) -> list[str]:
        """The prompts in sample order."""
        return self.samples.prompt_ids

    def __len__(self) -> int:
        """Samples in the dataset (one per prompt)."""
        return len(self.samples.prompt_ids)

    def _compute_approx_lengths(self) -> list[int]:
        """Tokens per sample, from the listing: the packer sizes its batches without a fetch."""
        return list(self.num_tokens)

    def _get_raw_data(self, index: int) -> dict[str, torch.Tensor]:
        """Prompt `index`'s sample, fetched now (waiting while it is captured)."""
        return self.samples.sample_of(self._open_client(), self.samples.prompt_ids[index])

    def _open_client(self) -> CacheClient:
        """This process's client: opened on first use, so each DataLoader worker holds its own."""
        if self._client is None or self._client_pid != os.getpid():  # a forked worker must not share a socket
            self._client = CacheClient(self.samples.server, token=self.samples.token)
            self._client_pid = os.getpid()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned DataLoader worker receives: everything but the open client."""
        return {**self.__dict__, "_client": None, "_client_pid": -1}


def _ids_and_lengths(
    listed: list[PromptState], prompt_ids: Sequence[str] | None, set_name: str | None
) -> tuple[list[str], list[int]]:
    """The prompts in sample order (the set's listing order, or the ids given) and their token counts;
    ValueError for an empty set, an id not registered, or a prompt whose response is not there yet."""
    by_id = {p.prompt_id: p for p in listed}
    ids = list(prompt_ids) if prompt_ids is not None else [p.prompt_id for p in listed]
    if not ids:
        raise ValueError(f"prompt set {set_name!r} has no prompts")
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise ValueError(f"{len(unknown)} prompt ids are not registered, e.g. {unknown[0]}")
    lengths = [by_id[i].num_tokens for i in ids]
    pending = [i for i, n in zip(ids, lengths, strict=True) if n is None]
    if pending:  # packing needs every length up front
        raise ValueError(
            f"{len(pending)} prompts have no response yet, so no length to pack by (e.g. {pending[0]}): "
            "wait for them first (CacheClient.wait_ready)"
        )
    return ids, [n for n in lengths if n is not None]
