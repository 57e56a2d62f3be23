"""Training samples straight from the cache: a torch `IterableDataset` over prompts, yielding each in the
schema a peer trainer reads. The client's torch side, loaded only when imported (as `safetensors.torch`
sits apart from `safetensors`): `import cache_server.client` never loads torch.

    from cache_server.client.torch_dataset import HiddenStatesDataset

    data = HiddenStatesDataset("http://cache:8000", layers=[2, 16, 29], layer_convention="hf_index",
                               set_name="ultrachat", format="speculators", rank=rank, world_size=world)
    for epoch in range(epochs):
        data.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=4, multiprocessing_context="spawn")
        for sample in loader: ...

Formats (T tokens, k aux layers of width H; the last layer is the target's last decoder output, L-1):
- `speculators`: `input_ids` [T] int64, `hidden_states` [T, k*H], `verifier_last_hidden_states` [T, H]
  (raw, before the final norm: its trainer applies the norm), `loss_mask` [T] int64.
- `specforge-eagle3`: `input_ids` [T], `loss_mask` [T], `hidden_state` [1, T, H] (after the target's
  final norm, applied by the server: `final_norm=post`), `aux_hidden_state` [1, T, k*H].
- `specforge-dflash`: `input_ids` [T], `loss_mask` [T], `hidden_states` [1, T, k*H].

The loss mask is the one stored with the prompt: its response tokens by default, a chat's assistant
turns, or what its registration gave (`loss_mask` in the prompt spec).
Every rank sees the same order of an epoch (shuffled with `seed + epoch`) and takes every
`world_size`-th prompt from its `rank`; DataLoader workers split a rank's share the same way. A prompt
still being captured is waited for (the server captures a cold prompt's missing layers on demand).
Start DataLoader workers with "spawn" (as speculators does): a worker forked after torch's OpenMP threads
have run can hang.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.utils.data import IterableDataset, get_worker_info

from cache_server.client.cache import CacheClient
from cache_server.client.errors import NotReadyError
from cache_server.client.results import HiddenResult, as_tensor
from schemas.choices import one_of
from schemas.hidden import FinalNormMode
from schemas.layers import RequestLayerConvention, decoder_outputs, layer_list_problem
from schemas.sample_formats import SAMPLE_FORMATS, SampleFormat

Sample = dict[str, torch.Tensor]


class HiddenStatesDataset(IterableDataset[Sample]):
    """The prompts of a set (or the ids given), each yielded once per epoch as a training sample in
    `format`, with the aux `layers` (in `layer_convention`) concatenated per token; ValueError, before
    the server is asked, for a format or convention outside their choices."""

    # keyword-only options, each named at the call
    def __init__(  # noqa: PLR0913
        self,
        server: str,
        *,
        layers: Sequence[int],
        format: SampleFormat,
        set_name: str | None = None,
        prompt_ids: Sequence[str] | None = None,
        layer_convention: RequestLayerConvention = "decoder_output_0based",
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        prefetch: int = 4,
        token: str | None = None,
        wait_s: float = 3600.0,
    ) -> None:
        if (set_name is None) == (prompt_ids is None):
            raise ValueError("name one of set_name or prompt_ids")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.server, self.token = server, token
        self.format = one_of(format, SAMPLE_FORMATS, "format")
        self.aux = decoder_outputs(layers, layer_convention)
        self.rank, self.world_size, self.seed, self.prefetch, self.wait_s = rank, world_size, seed, prefetch, wait_s
        self.epoch = 0
        with CacheClient(server, token=token) as client:
            num_layers = client.model().num_layers
            problem = layer_list_problem(self.aux, num_layers)
            if problem is not None:
                raise ValueError(problem)
            self.prompt_ids = list(prompt_ids) if prompt_ids is not None else _set_ids(client, set_name)
        self.last = num_layers - 1  # the target's last decoder output
        self.requests = _requests(format, self.aux, self.last)
        self.fetched = [k for layers, _ in self.requests for k in layers]  # the columns of a sample's fetch

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration follows."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Prompts this rank yields per epoch (over all its workers)."""
        return len(range(self.rank, len(self.prompt_ids), self.world_size))

    def epoch_order(self) -> list[str]:
        """Every prompt of the epoch, in the order all ranks share."""
        ids = list(self.prompt_ids)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(ids)
        return ids

    def __iter__(self) -> Iterator[Sample]:
        """This rank's and this DataLoader worker's share of the epoch, fetched `prefetch` ahead."""
        mine = self.epoch_order()[self.rank :: self.world_size]
        worker = get_worker_info()
        if worker is not None:
            mine = mine[worker.id :: worker.num_workers]
        with CacheClient(self.server, token=self.token) as client:
            yield from self.samples_of(client, mine)

    def samples_of(self, client: CacheClient, prompt_ids: Sequence[str]) -> Iterator[Sample]:
        """Each prompt's sample in order, at most `prefetch` fetched ahead of the one handed out."""
        with ThreadPoolExecutor(max(1, self.prefetch)) as pool:
            ahead: deque[Future[list[HiddenResult]]] = deque()
            try:
                for prompt_id in prompt_ids:
                    ahead.append(pool.submit(self.fetch, client, prompt_id))
                    if len(ahead) > self.prefetch:
                        yield self.sample(ahead.popleft().result())
                while ahead:
                    yield self.sample(ahead.popleft().result())
            finally:  # stopped early (an error, or the consumer left): fetch no more than what is running
                for future in ahead:
                    future.cancel()

    def sample_of(self, client: CacheClient, prompt_id: str) -> Sample:
        """One prompt's sample, fetched now (waiting while it is captured)."""
        return self.sample(self.fetch(client, prompt_id))

    def fetch(self, client: CacheClient, prompt_id: str) -> list[HiddenResult]:
        """The prompt's layers (one result per request of `requests`), waiting while it is captured (503
        with Retry-After) up to `wait_s`."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return [client.hidden(prompt_id, layers, final_norm=norm) for layers, norm in self.requests]
            except NotReadyError as e:
                if e.retry_after_s is None:  # stored bytes no capture can mend: not worth waiting for
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"prompt {prompt_id} was not ready within {self.wait_s} s") from e
                time.sleep(e.retry_after_s)

    def sample(self, results: list[HiddenResult]) -> Sample:
        """One fetched prompt in this dataset's format."""
        parts = [as_tensor(r.hidden) for r in results]
        hidden = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [T, len(fetched) * H]
        first = results[0]
        token_ids, h = as_tensor(first.token_ids), first.metadata.hidden_size
        aux = hidden[:, : len(self.aux) * h]
        loss_mask = torch.from_numpy(first.metadata.loss_mask())  # as stored with the prompt
        if self.format == "specforge-dflash":
            return {"input_ids": token_ids, "loss_mask": loss_mask, "hidden_states": aux[None]}
        at = len(self.fetched) - 1 - self.fetched[::-1].index(self.last)  # the last copy: normed if asked
        last = hidden[:, at * h : (at + 1) * h]
        if self.format == "speculators":
            return {
                "input_ids": token_ids,
                "hidden_states": aux,
                "verifier_last_hidden_states": last,
                "loss_mask": loss_mask,
            }
        return {
            "input_ids": token_ids,
            "loss_mask": loss_mask,
            "hidden_state": last[None],
            "aux_hidden_state": aux[None],
        }


def _requests(format: SampleFormat, aux: list[int], last: int) -> list[tuple[list[int], FinalNormMode]]:
    """The `/hidden` requests of one sample: the aux layers, and the last layer raw (speculators: its
    trainer norms it) or after the final norm (SpecForge EAGLE-3); a raw last layer that is an aux layer
    too is fetched once, a normed one apart."""
    if format == "specforge-dflash":
        return [(aux, "raw")]
    if format == "speculators":
        return [(aux if last in aux else [*aux, last], "raw")]
    return [([*aux, last], "post")] if last not in aux else [(aux, "raw"), ([last], "post")]


def _set_ids(client: CacheClient, set_name: str | None) -> list[str]:
    """The ids of a set's prompts, in the server's order (ValueError for an empty set)."""
    ids = [p.prompt_id for p in client.prompts(set_name=set_name)]
    if not ids:
        raise ValueError(f"prompt set {set_name!r} has no prompts")
    return ids
