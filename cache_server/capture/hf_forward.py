"""The target's transformers forward in the server's process: greedy and sampled responses, and the
`Capturer` that hooks every decoder layer's output under the project's layer convention (`hooks.py`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.captured import Captured
from cache_server.capture.heads import response_misses
from cache_server.capture.hooks import capture_decoder_outputs, decoder_layers
from cache_server.sampling import sample_token, seeded_generator
from cache_server.torch_utils import dtype_name
from schemas.prompts import CaptureInfo
from schemas.sampling import SamplingParams

log = logging.getLogger(__name__)


class HfForward:
    """A loaded causal LM: generates responses and captures layers. Not thread-safe: one compute thread owns it."""

    layers: frozenset[int] | None = None  # it captures any layer

    def __init__(
        self,
        model_dir: Path,
        *,
        device: torch.device,
        dtype: torch.dtype,
        device_map: str | None = None,
        pad_token_id: int = 0,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        """`device_map` ('auto' or a JSON map, as transformers takes it) spreads the layers over devices;
        inputs then go where the embeddings are, and each captured layer is copied from its own device.
        `pad_token_id` fills padded batches; a response ends after one of `stop_token_ids`."""
        if device_map is None:
            self.device = device
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
            model.to(self.device)  # type: ignore[arg-type]
        else:
            placement = device_map if device_map == "auto" else json.loads(device_map)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=placement)
            self.device = next(model.get_input_embeddings().parameters()).device
        self.model = model.eval()
        self.num_layers = len(decoder_layers(self.model))
        self.pad_token_id, self.stop_token_ids = pad_token_id, list(stop_token_ids)
        self.info = CaptureInfo.model_validate({"kind": "hf", "dtype": dtype_name(dtype)})  # validated: a stored dtype
        log.info("target %s loaded on %s as %s", model_dir.resolve().name, self.device, dtype)

    def close(self) -> None:
        """Nothing to release: the model goes with the process."""

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """The target's greedy response to each prompt, generated as one left-padded batch; a
        response ends after the model's EOS token if it has one."""
        longest = max(len(p) for p in prompts)
        pad = self.pad_token_id
        input_ids = torch.tensor([[pad] * (longest - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        out = self.model.generate(
            input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
        )
        stops = set(self.stop_token_ids)
        responses = []
        for row in out[:, longest:].tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
            responses.append([int(t) for t in row[:end]])
        return responses

    @torch.inference_mode()
    def sample(self, prompt: Sequence[int], max_new_tokens: int, params: SamplingParams) -> list[int]:
        """One response sampled at `params` (seeded by its seed): one sequence at a time, unpadded, so that
        a sample never depends on the sequences beside it; each token is drawn on the CPU from the
        fp32 distribution, so the stream of a seed is the same on any device. Ends after an EOS token."""
        if params.seed is None:
            raise ValueError("a sampled response needs a seed")
        generator = seeded_generator(params.seed, "cpu")
        stops = set(self.stop_token_ids)
        logits, cache = self._extend(list(prompt), None)
        response: list[int] = []
        while True:
            token = sample_token(logits[0, -1].float().cpu(), params, generator)
            response.append(token)
            if token in stops or len(response) == max_new_tokens:
                return response
            logits, cache = self._extend([token], cache)

    def _extend(self, tokens: list[int], cache: Any) -> tuple[torch.Tensor, Any]:
        """Logits of `tokens` after what `cache` holds, and the cache holding them too. The cache is the
        forward's fourth argument and the output's second field in every supported transformers release
        (named `past_key_values` before 5.x, `cache` since): passed and read by position."""
        out = self.model(torch.tensor([tokens], device=self.device), None, None, cache, use_cache=True)
        logits, cache = out.to_tuple()[:2]
        return logits, cache

    @torch.inference_mode()
    def capture(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_lens: Sequence[int],
        layers: Sequence[int],
        samplings: Sequence[SamplingParams | None] | None = None,
    ) -> list[Captured | Exception]:
        """One batched forward: per sequence, its layers' outputs and how its response agrees with the
        target under this very forward (greedy: tokens that are not the argmax; sampled at `samplings[i]`:
        tokens outside that setting's support).

        Right padding keeps every real position's causal context unchanged; a single sequence runs
        unpadded and without a mask, exactly as a direct forward would.
        """
        lengths = [len(s) for s in sequences]
        longest = max(lengths)
        pad = self.pad_token_id
        input_ids = torch.tensor([list(s) + [pad] * (longest - len(s)) for s in sequences], device=self.device)
        mask = None
        if len(sequences) > 1:
            mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long().to(self.device)
        with capture_decoder_outputs(self.model, layers, to_host=True) as captured:
            normed = self.model.model(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        lm_head = self.model.get_output_embeddings().weight.to(normed.device)  # once, not per sequence
        settings = samplings if samplings is not None else [None] * len(sequences)
        out: list[Captured | Exception] = []
        for i, (n, p, sampling) in enumerate(zip(lengths, prompt_lens, settings, strict=True)):
            misses = response_misses(normed[i, :n], input_ids[i, :n], p, sampling, lm_head)
            states = {k: captured[k][i, :n] for k in layers}  # views of the batch's host copy
            out.append(Captured.of(states, misses, sampling))
        return out
