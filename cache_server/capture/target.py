"""The target LLM: tokenizing prompts, greedy and sampled responses, and capturing decoder-layer outputs.

Layer k is the output of decoder layer k (0-based), captured by `hooks.capture_decoder_outputs`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cache_server.capture.fingerprint import target_fingerprint
from cache_server.capture.hooks import capture_decoder_outputs, decoder_layers
from cache_server.errors import InvalidPrompt
from cache_server.sampling import filtered_logits, sample_token, seeded_generator
from cache_server.torch_utils import dtype_name, resolve_device, resolve_dtype
from schemas.prompts import PromptSpec
from schemas.sampling import SamplingParams
from schemas.storage import StorageName

log = logging.getLogger(__name__)


# Positions per lm_head chunk when checking greedy agreement: 1024 x 152k vocab fp32 = 0.6 GB.
_ARGMAX_ROWS = 1024
# Final norms computed exactly as `weight * x / sqrt(mean(x^2) + eps)` (x in fp32, cast back before the weight).
PLAIN_RMSNORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"}


@dataclass(frozen=True)
class Captured:
    """One sequence's captured layers and how its response agrees with the target: a greedy response's
    tokens that are not the argmax, or a sampled one's outside the support of its setting."""

    states: dict[int, torch.Tensor]  # layer -> [T, H] on CPU, the target dtype
    greedy_mismatches: int | None  # greedy responses (None for sampled ones)
    outside_support: int | None = None  # sampled responses (None for greedy ones)


@dataclass(frozen=True)
class TargetInfo:
    """What the server says about its target in `GET /model`."""

    name: str
    fingerprint: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: torch.dtype
    storage: StorageName = "exact"  # how the store keeps its states (part of the fingerprint)


def check_model_dir(model_dir: Path) -> None:
    """FileNotFoundError unless `model_dir` is a Hugging Face model directory."""
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model {model_dir} is not a Hugging Face model directory (no config.json)")


class Target:
    """A loaded causal LM plus its tokenizer. Not thread-safe: one compute thread owns it."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "auto",
        dtype: str | None = None,
        device_map: str | None = None,
        storage: StorageName = "exact",
    ) -> None:
        """`device_map` ('auto' or a JSON map, as transformers takes it) spreads the layers over devices;
        inputs then go where the embeddings are, and each captured layer is copied from its own device.
        `storage` is how the store will keep the states: part of the fingerprint."""
        torch_dtype = resolve_dtype(dtype, resolve_device("auto" if device_map is not None else device))
        check_model_dir(model_dir)
        fingerprint = target_fingerprint(model_dir, dtype_name(torch_dtype), storage)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if device_map is None:
            self.device = resolve_device(device)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
            model.to(self.device)  # type: ignore[arg-type]
        else:
            placement = device_map if device_map == "auto" else json.loads(device_map)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, device_map=placement)
            self.device = next(model.get_input_embeddings().parameters()).device
        self.model = model.eval()
        cfg = self.model.config
        self.layers = decoder_layers(self.model)
        self.info = TargetInfo(
            name=model_dir.resolve().name,
            fingerprint=fingerprint,
            num_layers=len(self.layers),
            hidden_size=int(cfg.hidden_size),
            vocab_size=int(cfg.vocab_size),
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 1 << 30)),
            dtype=torch_dtype,
            storage=storage,
        )
        log.info(
            "target %s loaded on %s as %s (fingerprint %s)",
            self.info.name,
            self.device,
            torch_dtype,
            fingerprint,
        )

    # -- prompts --------------------------------------------------------------------------------

    def encode(self, spec: PromptSpec) -> list[int]:
        """Prompt token ids for a spec; raises InvalidPrompt for ids outside the vocabulary."""
        if spec.token_ids is not None:
            ids = list(spec.token_ids)
        elif spec.messages is not None:
            if any(m.content is None for m in spec.messages):
                raise InvalidPrompt("a response_of message must be filled in before the prompt is rendered")
            ids = self._apply_chat_template(
                [{"role": m.role, "content": m.content or ""} for m in spec.messages], spec.enable_thinking
            )
        else:
            ids = list(self.tokenizer(spec.text).input_ids)
        if not ids:
            raise InvalidPrompt("the prompt tokenizes to zero tokens")
        self.check_token_ids(ids, "token_ids")
        if spec.response_token_ids is not None:
            self.check_token_ids(spec.response_token_ids, "response_token_ids")
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Token ids as text, special tokens left out (how a chat client reads an answer back)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    @property
    def chat_template_sha256(self) -> str | None:
        """sha256 of the tokenizer's chat template text (what renders `messages`), or None without one."""
        template = getattr(self.tokenizer, "chat_template", None)
        return hashlib.sha256(template.encode()).hexdigest() if isinstance(template, str) and template else None

    def _apply_chat_template(self, messages: list[dict[str, str]], enable_thinking: bool | None) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidPrompt("the target's tokenizer has no chat template: send the prompt as text or token_ids")
        extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        try:
            out: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
        except Exception as e:  # jinja errors raised by the template itself (e.g. raise_exception)
            raise InvalidPrompt(f"the target's chat template refused these messages: {e}") from None
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def check_token_ids(self, ids: Sequence[int], field: str) -> None:
        """InvalidPrompt for ids outside the vocabulary."""
        bad = [t for t in ids if not 0 <= t < self.info.vocab_size]
        if bad:
            raise InvalidPrompt(f"{field} has ids outside the vocabulary [0, {self.info.vocab_size}): {bad[:5]}")

    def check_length(self, total_tokens: int) -> None:
        """InvalidPrompt for a prompt plus response longer than the model's context."""
        if total_tokens > self.info.max_position_embeddings:
            raise InvalidPrompt(
                f"prompt plus response would be {total_tokens} tokens, beyond the model's context of "
                f"{self.info.max_position_embeddings}"
            )

    # -- compute --------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """The target's greedy response to each prompt, generated as one left-padded batch; a
        response ends after the model's EOS token if it has one."""
        longest = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id or 0
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

    @property
    def stop_token_ids(self) -> list[int]:
        """The ids a greedy response ends after: the generation config's EOS (none for some models)."""
        eos = self.model.generation_config.eos_token_id
        return [int(t) for t in (eos if isinstance(eos, list) else [] if eos is None else [eos])]

    @torch.inference_mode()
    def capture(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_lens: Sequence[int],
        layers: Sequence[int],
        samplings: Sequence[SamplingParams | None] | None = None,
    ) -> list[Captured]:
        """One batched forward: per sequence, its layers' outputs and how its response agrees with the
        target under this very forward (greedy: tokens that are not the argmax; sampled at `samplings[i]`:
        tokens outside that setting's support).

        Right padding keeps every real position's causal context unchanged; a single sequence runs
        unpadded and without a mask, exactly as a direct forward would.
        """
        lengths = [len(s) for s in sequences]
        longest = max(lengths)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([list(s) + [pad] * (longest - len(s)) for s in sequences], device=self.device)
        mask = None
        if len(sequences) > 1:
            mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long().to(self.device)
        with capture_decoder_outputs(self.model, layers, to_host=True) as captured:
            normed = self.model.model(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        settings = samplings if samplings is not None else [None] * len(sequences)
        out = []
        for i, (n, p, sampling) in enumerate(zip(lengths, prompt_lens, settings, strict=True)):
            misses = self._response_misses(normed[i, :n], input_ids[i, :n], p, sampling)
            out.append(
                Captured(
                    states={k: captured[k][i, :n] for k in layers},  # views of the batch's host copy
                    greedy_mismatches=misses if sampling is None else None,
                    outside_support=misses if sampling is not None else None,
                )
            )
        return out

    def _response_misses(
        self, normed: torch.Tensor, tokens: torch.Tensor, prompt_len: int, sampling: SamplingParams | None
    ) -> int:
        """Response tokens t[s] (s >= prompt_len) that the target would not emit after t[:s]: not
        argmax lm_head(h[s - 1]) when greedy, else outside the support of `sampling`'s filters there."""
        misses = 0
        lm_head = self.model.get_output_embeddings()
        for lo in range(prompt_len - 1, len(tokens) - 1, _ARGMAX_ROWS):  # bounded [rows, vocab] logits
            hi = min(lo + _ARGMAX_ROWS, len(tokens) - 1)
            logits = lm_head(normed[lo:hi])
            actual = tokens[lo + 1 : hi + 1].to(logits.device)
            if sampling is None:
                misses += int((logits.argmax(dim=-1) != actual).sum())
            else:
                allowed = filtered_logits(logits, sampling).gather(-1, actual[:, None])
                misses += int(torch.isneginf(allowed).sum())
        return misses

    def final_norm(self) -> tuple[torch.Tensor, float] | None:
        """The final norm's weight (on CPU) and eps, what HF applies to the last `hidden_states` entry, when it
        is the plain RMSNorm `weight * x / sqrt(mean(x^2) + eps)`; None for any other norm."""
        norm = getattr(self.model.get_decoder(), "norm", None)
        if norm is None or type(norm).__name__ not in PLAIN_RMSNORMS:
            return None
        return norm.weight.detach().to("cpu"), float(norm.variance_epsilon)

    def heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(embed_tokens.weight, lm_head.weight) on CPU, what a DFlash drafter borrows."""
        embed = self.model.get_input_embeddings().weight.detach().to("cpu")
        lm_head = self.model.get_output_embeddings().weight.detach().to("cpu")
        return embed, lm_head
