"""The target's heads: input embedding, output head and final norm, read from the checkpoint's
safetensors shards directly (an engine-captured target never builds its model), or taken from a loaded
model. They serve `GET /target/heads` and the response checks: a response token t[s] is the target's
greedy choice when it is argmax lm_head(final_norm(h[s - 1])) of the last layer's raw output h."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig

from cache_server.sampling import filtered_logits
from cache_server.torch_utils import rms_norm
from schemas.hidden import PLAIN_NORM_KIND, ZERO_CENTERED_NORM_KIND
from schemas.sampling import SamplingParams

# Final norms computed exactly as `weight * x / sqrt(mean(x^2) + eps)` (x in fp32, cast back before the weight).
PLAIN_RMSNORMS = {
    "LlamaRMSNorm",
    "Qwen2RMSNorm",
    "Qwen3RMSNorm",
    "Qwen3MoeRMSNorm",
    "MistralRMSNorm",
    "DeepseekV3RMSNorm",
}
# Final norms computed as `(1 + weight) * x / sqrt(mean(x^2) + eps)` all in fp32, cast back at the end
# (Gemma-style: the weight is stored zero-centred).
ZERO_CENTERED_RMSNORMS = {"Qwen3NextRMSNorm", "Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm"}
# The model types whose final norm is one of those (what a checkpoint says without building the model).
PLAIN_RMSNORM_MODEL_TYPES = {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "deepseek_v3"}
ZERO_CENTERED_RMSNORM_MODEL_TYPES = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
# `final_norm_kind` on the wire (`GET /target/heads`).
EMBED_KEY, LM_HEAD_KEY, NORM_KEY = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
# Positions per lm_head chunk when checking responses: 1024 x 152k vocab fp32 = 0.6 GB.
_ARGMAX_ROWS = 1024


@dataclass(frozen=True)
class FinalNorm:
    """The target's final RMSNorm: `weight * x / sqrt(mean(x^2) + eps)`, or with `zero_centered`
    `(1 + weight) * x / sqrt(mean(x^2) + eps)` (Qwen3-Next, Qwen3.5)."""

    weight: torch.Tensor  # [H] on CPU, the target dtype
    eps: float
    zero_centered: bool = False

    @property
    def kind(self) -> str:
        """Its `final_norm_kind` on the wire: "rmsnorm" or "rmsnorm_zero_centered"."""
        return ZERO_CENTERED_NORM_KIND if self.zero_centered else PLAIN_NORM_KIND

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] raw last-layer output -> normed, as transformers' norm of that kind computes it."""
        return rms_norm(hidden, self.weight, self.eps, self.zero_centered)


@dataclass(frozen=True)
class Heads:
    """embed_tokens [V, H], lm_head [V, H] (the same tensor when tied) and the final norm when it is an
    RMSNorm of a kind `FinalNorm` computes (None for any other norm), on CPU in the target dtype."""

    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: FinalNorm | None

    @classmethod
    def from_model(cls, model: Any) -> Heads:
        """A loaded transformers causal LM's own heads (no copy when it is on CPU)."""
        embed = model.get_input_embeddings().weight.detach().to("cpu")
        lm_head = model.get_output_embeddings().weight.detach().to("cpu")
        norm = getattr(model.get_decoder(), "norm", None)
        final_norm = None
        if norm is not None and type(norm).__name__ in PLAIN_RMSNORMS:
            final_norm = FinalNorm(norm.weight.detach().to("cpu"), float(norm.variance_epsilon))
        elif norm is not None and type(norm).__name__ in ZERO_CENTERED_RMSNORMS:
            final_norm = FinalNorm(norm.weight.detach().to("cpu"), float(norm.eps), zero_centered=True)
        return cls(embed, lm_head, final_norm)

    @classmethod
    def from_checkpoint(cls, model_dir: Path, dtype: torch.dtype) -> Heads:
        """The three tensors read from the safetensors shards by name, cast to `dtype` as loading the
        model would; FileNotFoundError without safetensors shards, KeyError naming a missing tensor."""
        cfg = AutoConfig.from_pretrained(model_dir)
        text = cfg.get_text_config()
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        wanted = [EMBED_KEY, NORM_KEY] + ([] if tied else [LM_HEAD_KEY])
        tensors = {k: v.to(dtype) for k, v in _read_tensors(model_dir, wanted).items()}
        model_type, final_norm = getattr(text, "model_type", None), None
        if model_type in PLAIN_RMSNORM_MODEL_TYPES or model_type in ZERO_CENTERED_RMSNORM_MODEL_TYPES:
            zero_centered = model_type in ZERO_CENTERED_RMSNORM_MODEL_TYPES
            final_norm = FinalNorm(tensors[NORM_KEY], float(text.rms_norm_eps), zero_centered)
        embed = tensors[EMBED_KEY]
        return cls(embed, embed if tied else tensors[LM_HEAD_KEY], final_norm)

    def response_misses(
        self, last_layer: torch.Tensor, tokens: torch.Tensor, prompt_len: int, sampling: SamplingParams | None
    ) -> int:
        """Response misses (`response_misses`) from the last layer's raw output [T, H]; ValueError when
        the final norm is not an RMSNorm the cache serves (the check would not be the target's)."""
        if self.final_norm is None:
            raise ValueError(
                "the target's final norm is not an RMSNorm the cache serves: responses cannot be checked from states"
            )
        return response_misses(self.final_norm(last_layer), tokens, prompt_len, sampling, self.lm_head)


def response_misses(
    normed: torch.Tensor, tokens: torch.Tensor, prompt_len: int, sampling: SamplingParams | None, lm_head: torch.Tensor
) -> int:
    """Response tokens t[s] (s >= prompt_len) that the target would not emit after t[:s]: not argmax
    lm_head(normed[s - 1]) when greedy, else outside the support of `sampling`'s filters there.
    `normed` [T, H] is the final-normed last layer; `lm_head` [V, H] on the same device."""
    misses = 0
    for lo in range(prompt_len - 1, len(tokens) - 1, _ARGMAX_ROWS):  # bounded [rows, vocab] logits
        hi = min(lo + _ARGMAX_ROWS, len(tokens) - 1)
        logits = torch.nn.functional.linear(normed[lo:hi], lm_head)
        actual = tokens[lo + 1 : hi + 1].to(logits.device)
        if sampling is None:
            misses += int((logits.argmax(dim=-1) != actual).sum())
        else:
            allowed = filtered_logits(logits, sampling).gather(-1, actual[:, None])
            misses += int(torch.isneginf(allowed).sum())
    return misses


def _read_tensors(model_dir: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors from a model directory's safetensors files (sharded through its index, or one
    `model.safetensors`), each read alone: nothing else of the weights is loaded."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    elif (model_dir / "model.safetensors").is_file():
        weight_map = dict.fromkeys(names, "model.safetensors")
    else:
        raise FileNotFoundError(f"{model_dir} has no safetensors weights: the heads are read from them")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        if name not in weight_map:
            raise KeyError(f"{model_dir} has no tensor {name!r} (its safetensors index does not list it)")
        with safe_open(model_dir / weight_map[name], framework="pt") as f:
            if name not in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                raise KeyError(f"{model_dir / weight_map[name]} has no tensor {name!r}")
            out[name] = f.get_tensor(name)
    return out
