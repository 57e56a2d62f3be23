"""A live greedy speculative loop with a target's MTP head, written from vLLM 0.32's MTP model files
(`deepseek_mtp.py`, `qwen3_next_mtp.py`, `qwen3_5_mtp.py`) and its proposer, independent of `eval_worker`.

The block is transformers' own decoder layer: each MTP layer becomes a one-layer model of the target's
family whose final norm is the MTP head's last norm (DeepSeek `shared_head.norm`, Qwen `mtp.norm`), so
`model(inputs_embeds=x).last_hidden_state` is the state both the logits and the next step read. Nothing
is cached: every draft step recomputes the MTP layer over the whole prefix, and every round recomputes
the target (a hybrid's recurrent state cannot be rolled back by cropping a cache).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

DEEPSEEK_TYPES = ("deepseek_v3",)
QWEN_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


Tensors = dict[str, torch.Tensor]


class MtpReferenceError(ValueError):
    """The directory holds no MTP head this loop knows how to run."""


@dataclass(frozen=True)
class MtpRun:
    """A greedy run: the generated tokens and, per verification round, the drafts and how many the
    target accepted. vLLM's counters: drafts = len(accepted); accepted at position i = rounds with
    accepted > i."""

    tokens: list[int]
    drafts: list[list[int]]
    accepted: list[int]

    def round_taus(self) -> list[int]:
        """Tokens per round as an offline walk over `tokens` counts them: accepted drafts + 1, the last round
        capped at the drafts left in `tokens` + 1 (the loop, like vLLM, counts drafts past max_tokens in it)."""
        taus = [a + 1 for a in self.accepted]
        left = len(self.tokens) - sum(taus[:-1])  # the first token is the prefill's: drafts left + 1
        return [*taus[:-1], min(taus[-1], left)] if taus else []

    def accepted_per_position(self, k: int) -> list[int]:
        """vLLM's `spec_decode_num_accepted_tokens_per_pos` for `k` drafts per round."""
        return [sum(a > i for a in self.accepted) for i in range(k)]


@dataclass(frozen=True)
class _Head:
    """One MTP layer: its input norms and projection, and the one-layer model that runs its block."""

    norm_embed: torch.nn.Module
    norm_hidden: torch.nn.Module
    proj: torch.Tensor  # [H, 2H]: input order [embedding, hidden]
    block: PreTrainedModel
    mask_position_zero: bool


def _weights(target_dir: Path) -> Tensors:
    tensors: Tensors = {}
    for shard in sorted(target_dir.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def _norm(cls: type[torch.nn.Module], weight: torch.Tensor, eps: float) -> torch.nn.Module:
    norm = cls(weight.shape[0], eps=eps)
    norm.load_state_dict({"weight": weight})
    return norm.eval()


def _one_layer_model(config_dict: dict[str, Any], weights: Tensors, dtype: torch.dtype) -> PreTrainedModel:
    """A one-layer model of the target's family, loaded by transformers from a temporary checkpoint so
    that its own name conversions (per-expert tensors into fused ones) apply."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config_dict))
        save_file({k: v.contiguous() for k, v in weights.items()}, Path(tmp) / "model.safetensors")
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype)
    return model.eval()


class MtpReference:
    """The target in `target_dir` (transformers, `dtype`) and MTP layer `layer` of its head. vLLM's
    proposer runs the first MTP layer at every draft step, hence the default."""

    def __init__(self, target_dir: Path, *, layer: int = 0, dtype: torch.dtype = torch.float32) -> None:
        config = json.loads((target_dir / "config.json").read_text())
        self.model_type = config["model_type"]
        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
        self.dtype = dtype
        weights = _weights(target_dir)
        if self.model_type in DEEPSEEK_TYPES:
            self.head = self._deepseek_head(config, weights, layer)
        elif self.model_type in QWEN_TYPES:
            self.head = self._qwen_head(config, weights, layer)
        else:
            raise MtpReferenceError(f"no MTP layout known for model_type {self.model_type!r}")

    def _shared(self) -> Tensors:
        # The proposer replaces the MTP head's embedding and lm_head with the target's.
        return {
            "model.embed_tokens.weight": self.target.get_input_embeddings().weight.data,
            "lm_head.weight": self.target.get_output_embeddings().weight.data,
        }

    def _deepseek_head(self, config: dict[str, Any], weights: Tensors, layer: int) -> _Head:
        """`model.layers.{L+layer}.*`: enorm, hnorm, eh_proj, shared_head.norm and a DeepseekV2 block."""
        n = config.get("num_nextn_predict_layers", 0)
        if layer >= n:
            raise MtpReferenceError(f"MTP layer {layer} asked, config declares {n}")
        index = config["num_hidden_layers"] + layer
        prefix = f"model.layers.{index}."
        own = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
        if "eh_proj.weight" not in own:
            raise MtpReferenceError(f"no {prefix}eh_proj.weight in the checkpoint")
        is_moe = config.get("n_routed_experts") is not None and index >= config["first_k_dense_replace"]
        block_config = dict(config, num_hidden_layers=1, first_k_dense_replace=0 if is_moe else 1)
        block_config["num_nextn_predict_layers"] = 0
        head_keys = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
        block = {f"model.layers.0.{k}": v for k, v in own.items() if not k.startswith(head_keys)}
        block["model.norm.weight"] = own["shared_head.norm.weight"]
        norm_cls = type(self.target.model.norm)
        eps = config["rms_norm_eps"]
        return _Head(
            norm_embed=_norm(norm_cls, own["enorm.weight"], eps),
            norm_hidden=_norm(norm_cls, own["hnorm.weight"], eps),
            proj=own["eh_proj.weight"].to(self.dtype),
            block=_one_layer_model(block_config, {**block, **self._shared()}, self.dtype),
            mask_position_zero=True,
        )

    def _qwen_head(self, config: dict[str, Any], weights: Tensors, layer: int) -> _Head:
        """`mtp.*`: pre_fc_norm_embedding, pre_fc_norm_hidden, fc, layers.{layer} (full attention), norm."""
        key = "num_nextn_predict_layers" if self.model_type == "qwen3_next" else "mtp_num_hidden_layers"
        n = config.get(key, 1)
        if layer >= n or "mtp.fc.weight" not in weights:
            raise MtpReferenceError(
                f"MTP layer {layer} asked; config declares {n} ({key}), fc present: {'mtp.fc.weight' in weights}"
            )
        prefix = f"mtp.layers.{layer}."
        block = {"model.layers.0." + k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
        block["model.norm.weight"] = weights["mtp.norm.weight"]
        # vLLM builds the layer with index `layer`, full attention; Qwen3-Next decides MoE on that index.
        block_config = dict(config, num_hidden_layers=1, layer_types=["full_attention"])
        if self.model_type == "qwen3_next":
            step = config.get("decoder_sparse_step", 1)
            dense = layer in config.get("mlp_only_layers", []) or (layer + 1) % step != 0
            block_config["mlp_only_layers"] = [0] if dense else []
            block_config["decoder_sparse_step"] = 1
        norm_cls = type(self.target.model.norm)
        eps = config["rms_norm_eps"]
        return _Head(
            norm_embed=_norm(norm_cls, weights["mtp.pre_fc_norm_embedding.weight"], eps),
            norm_hidden=_norm(norm_cls, weights["mtp.pre_fc_norm_hidden.weight"], eps),
            proj=weights["mtp.fc.weight"].to(self.dtype),
            block=_one_layer_model(block_config, {**block, **self._shared()}, self.dtype),
            mask_position_zero=False,
        )

    @torch.no_grad()
    def target_states(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's post-final-norm states [N, H] (what vLLM hands the head) and greedy next tokens [N]."""
        ids = torch.tensor([tokens])
        states = self.target.model(input_ids=ids, use_cache=False).last_hidden_state[0]
        return states, self.target.lm_head(states).argmax(-1)

    @torch.no_grad()
    def head_states(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The MTP layer over pairs (hidden[p], tokens[p]) at positions 0..M-1 -> its output [M, H]:
        post shared_head.norm (DeepSeek) or post mtp.norm (Qwen); logits are lm_head of it."""
        head = self.head
        embed = self.target.get_input_embeddings()(tokens)
        if head.mask_position_zero:
            embed = embed.clone()
            embed[0] = 0  # deepseek_mtp: embeddings at position 0 are zeroed before enorm
        x = torch.cat([head.norm_embed(embed), head.norm_hidden(hidden)], dim=-1) @ head.proj.T
        return head.block.model(inputs_embeds=x[None], use_cache=False).last_hidden_state[0]

    @torch.no_grad()
    def draft(self, tokens: list[int], k: int) -> list[int]:
        """`k` greedy drafts after `tokens` (the last one just sampled by the target): pairs
        (h_p, t_{p+1}) for p < N teacher-forced, then each draft step appends (its output, its draft)."""
        states, _ = self.target_states(tokens[:-1])
        hidden, inputs = states, torch.tensor(tokens[1:])
        drafts: list[int] = []
        for _ in range(k):
            out = self.head_states(hidden, inputs)
            token = int(self.target.lm_head(out[-1]).argmax())
            drafts.append(token)
            hidden = torch.cat([hidden, out[-1:]])
            inputs = torch.cat([inputs, torch.tensor([token])])
        return drafts

    def run(self, prompt: list[int], max_new_tokens: int, k: int) -> MtpRun:
        """Greedy generation of `max_new_tokens` with `k` MTP drafts per round, verified by the target:
        a round accepts the longest prefix of drafts equal to the target's greedy tokens, plus one."""
        if k < 1 or max_new_tokens < 1 or len(prompt) < 2:
            raise ValueError("need k >= 1, max_new_tokens >= 1 and a prompt of 2 tokens or more")
        tokens = list(prompt)
        tokens.append(int(self.target_states(tokens)[1][-1]))
        new = [tokens[-1]]
        all_drafts: list[list[int]] = []
        accepted: list[int] = []
        while len(new) < max_new_tokens:
            drafts = self.draft(tokens, k)
            greedy = self.target_states(tokens + drafts)[1][len(tokens) - 1 :].tolist()  # k + 1 tokens
            count = 0
            while count < k and drafts[count] == greedy[count]:
                count += 1
            step = [*drafts[:count], greedy[count]]
            tokens += step
            new += step
            all_drafts.append(drafts)
            accepted.append(count)
        return MtpRun(tokens=new[:max_new_tokens], drafts=all_drafts, accepted=accepted)
