"""Tiny random targets carrying MTP heads, saved in HF format as the published checkpoints lay them out.

transformers builds and saves each target; the MTP tensors are then added to its safetensors under the
published names: DeepSeek-V3 at `model.layers.{L+i}.*` (`enorm`, `hnorm`, `eh_proj`, `shared_head`, a
decoder block, copies of `embed_tokens`), Qwen3-Next and Qwen3.5 under `mtp.*` (`fc`,
`pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `layers.{i}`, `norm`). A block's tensors come from a
second model of the same family saved by transformers, so expert and projection names are its own.
Sizes fit vLLM's CPU kernels: attention head_dim 32, MLA latent 512 + rope 64, Gated-DeltaNet head 128.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
)

from cache_server.capture.tiny_model import build_tokenizer

VOCAB = 512
HIDDEN = 128
WEIGHT_STD = 0.08  # as cache_server.capture.tiny_model: varied greedy continuations
NORM_STD = 0.1  # norm weights move off their init so a wrong (1 + w) vs w convention shows

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Tuning:
    """How far from pure noise a target and its head are. A random head is never accepted; with
    `residual_scale` < 1 (o_proj and down_proj scaled) a target leans on its current token, and
    `copy_embed` / `copy_hidden` add multiples of the identity to the head's projection over
    [embedding, hidden], so drafts get accepted while still depending on every input. Qwen3-Next with
    `Tuning(0.1, 6.0, 3.0)` accepts ~30% of first drafts on short prompts."""

    residual_scale: float = 1.0
    copy_embed: float = 0.0
    copy_hidden: float = 0.0


def _randomised(config: PretrainedConfig, seed: int, tuning: Tuning) -> PreTrainedModel:
    """A model of `config` with matrices N(0, WEIGHT_STD) and every norm weight jittered around its init."""
    torch.manual_seed(seed)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, WEIGHT_STD)
                if "o_proj" in name or "down_proj" in name:
                    p.mul_(tuning.residual_scale)
            elif "norm" in name:
                p.add_(torch.randn_like(p) * NORM_STD)
    return model


def _saved_tensors(config: PretrainedConfig, seed: int, tuning: Tuning) -> Tensors:
    """The tensors transformers writes for a randomised model of `config`, under the names it saves."""
    with tempfile.TemporaryDirectory() as tmp:
        _randomised(config, seed, tuning).save_pretrained(tmp)
        tensors: Tensors = {}
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(shard))
    return tensors


def _save_target(out_dir: Path, config: PretrainedConfig, seed: int, tuning: Tuning) -> Tensors:
    """Save the target and the project's tiny tokenizer; return the target's tensors."""
    tokenizer = build_tokenizer(config.vocab_size)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    model = _randomised(config, seed, tuning)
    model.generation_config.eos_token_id = None  # tiny random models should not stop early
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _add_tensors(out_dir: Path, extra: Tensors) -> None:
    """Add `extra` to the saved checkpoint: a new shard named in the index if sharded, else in place."""
    extra = {k: v.contiguous() for k, v in extra.items()}
    index_path = out_dir / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
        save_file(extra, out_dir / "model-mtp.safetensors", metadata={"format": "pt"})
        index["weight_map"].update(dict.fromkeys(extra, "model-mtp.safetensors"))
        index_path.write_text(json.dumps(index, indent=2))
        return
    path = out_dir / "model.safetensors"
    tensors = load_file(path)
    clash = sorted(set(tensors) & set(extra))
    if clash:
        raise ValueError(f"MTP tensors would overwrite target tensors: {clash[:3]}")
    tensors.update(extra)
    save_file(tensors, path, metadata={"format": "pt"})


def _patch_config(out_dir: Path, updates: dict[str, object]) -> None:
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(updates)
    path.write_text(json.dumps(config, indent=2) + "\n")


def _norm(init: float, gen: torch.Generator) -> torch.Tensor:
    return init + torch.randn(HIDDEN, generator=gen) * NORM_STD


def _projection(gen: torch.Generator, tuning: Tuning) -> torch.Tensor:
    """`eh_proj` / `fc` [H, 2H] over [embedding, hidden]."""
    proj = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * WEIGHT_STD
    proj[:, :HIDDEN] += tuning.copy_embed * torch.eye(HIDDEN)
    proj[:, HIDDEN:] += tuning.copy_hidden * torch.eye(HIDDEN)
    return proj


def deepseek_v3_config(layers: int = 2, mtp_layers: int = 1) -> DeepseekV3Config:
    """A tiny DeepSeek-V3: MLA (latent 512, rope 64, as vLLM's CPU MLA requires), layer 0 dense, then MoE
    with 4 routed experts (top-2) and 1 shared expert."""
    return DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        moe_intermediate_size=HIDDEN // 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=64,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        num_mtp_layers=mtp_layers,  # saved as `num_nextn_predict_layers`, the published key
    )


def save_deepseek_v3_mtp(
    out_dir: Path, *, layers: int = 2, mtp_layers: int = 1, seed: int = 0, tuning: Tuning = Tuning()
) -> Path:
    """Save a tiny DeepSeek-V3 whose MTP layers sit at `model.layers.{layers + i}` (i < mtp_layers), each
    with `enorm`, `hnorm`, `eh_proj [H, 2H]`, `shared_head.{norm, head}`, `embed_tokens` (copies of the
    target's, as published) and a decoder block (MoE, as layer index >= first_k_dense_replace)."""
    target = _save_target(out_dir, deepseek_v3_config(layers, mtp_layers), seed, tuning)
    donor = _saved_tensors(deepseek_v3_config(layers + mtp_layers, 0), seed + 1, tuning)
    gen = torch.Generator().manual_seed(seed + 2)
    extra: Tensors = {}
    for i in range(mtp_layers):
        prefix = f"model.layers.{layers + i}."
        extra.update({k: v for k, v in donor.items() if k.startswith(prefix)})
        extra[prefix + "enorm.weight"] = _norm(1.0, gen)
        extra[prefix + "hnorm.weight"] = _norm(1.0, gen)
        extra[prefix + "eh_proj.weight"] = _projection(gen, tuning)
        extra[prefix + "shared_head.norm.weight"] = _norm(1.0, gen)
        extra[prefix + "shared_head.head.weight"] = target["lm_head.weight"].clone()
        extra[prefix + "embed_tokens.weight"] = target["model.embed_tokens.weight"].clone()
    _add_tensors(out_dir, extra)
    # The published config's routing keys: transformers implies them, vLLM reads them (softmax without).
    routing = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1}
    _patch_config(out_dir, {"num_nextn_predict_layers": mtp_layers, **routing})
    return out_dir


def _layer_types(layers: int, linear_attention: bool) -> list[str]:
    """Qwen's pattern: three Gated-DeltaNet layers, then one full-attention layer; the last is full."""
    if not linear_attention:
        return ["full_attention"] * layers
    return ["full_attention" if (i + 1) % 4 == 0 or i == layers - 1 else "linear_attention" for i in range(layers)]


# vLLM's CPU Gated-DeltaNet kernel takes the published head dim (128) only, and runs in bf16 only.
_LINEAR: dict[str, Any] = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
}
_ATTENTION: dict[str, Any] = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}


def qwen3_next_config(layers: int = 2, *, linear_attention: bool = True) -> Qwen3NextConfig:
    """A tiny Qwen3-Next: gated attention (head_dim 32), MoE in every layer (4 experts, top-2, a shared
    expert), Gated-DeltaNet layers unless `linear_attention` is False."""
    return Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=layers,
        layer_types=_layer_types(layers, linear_attention),
        decoder_sparse_step=1,
        moe_intermediate_size=HIDDEN // 2,
        shared_expert_intermediate_size=HIDDEN // 2,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        **_ATTENTION,
        **_LINEAR,
    )


def qwen3_5_config(layers: int = 2, *, moe: bool = False, linear_attention: bool = True) -> PretrainedConfig:
    """A tiny text-only Qwen3.5 (`qwen3_5_text`, dense MLP) or Qwen3.5-MoE (`qwen3_5_moe_text`)."""
    common: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "layer_types": _layer_types(layers, linear_attention),
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        **_ATTENTION,
        **_LINEAR,
    }
    if moe:
        return Qwen3_5MoeTextConfig(
            moe_intermediate_size=HIDDEN // 2,
            shared_expert_intermediate_size=HIDDEN // 2,
            num_experts=4,
            num_experts_per_tok=2,
            **common,
        )
    return Qwen3_5TextConfig(intermediate_size=2 * HIDDEN, **common)


def head_config_for(target: PretrainedConfig) -> PretrainedConfig:
    """The config of an MTP head added to a dense target that ships none (the demo's Qwen3): Qwen3.5's
    text config of the target's shape, full attention throughout, declaring one head."""
    config = Qwen3_5TextConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_hidden_layers=target.num_hidden_layers,
        layer_types=_layer_types(target.num_hidden_layers, linear_attention=False),
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim,
        max_position_embeddings=target.max_position_embeddings,
        rms_norm_eps=target.rms_norm_eps,
        tie_word_embeddings=False,
        architectures=["Qwen3_5ForCausalLM"],
    )
    config.update({"mtp_num_hidden_layers": 1})  # the published configs' key, not an argument of the class
    return config


def _save_mtp_prefixed(
    out_dir: Path, target: PretrainedConfig, block: PretrainedConfig, seed: int, tuning: Tuning, key: str, n: int
) -> Path:
    """Save the target, then add `mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm}` and
    `mtp.layers.{i}.*` taken from `block`, a full-attention model of the same family; declare them by `key`."""
    _save_target(out_dir, target, seed, tuning)
    donor = _saved_tensors(block, seed + 1, tuning)
    gen = torch.Generator().manual_seed(seed + 2)
    # Gemma-style norms (x * (1 + w)) are stored zero-centred.
    extra: Tensors = {
        "mtp.fc.weight": _projection(gen, tuning),
        "mtp.pre_fc_norm_embedding.weight": _norm(0.0, gen),
        "mtp.pre_fc_norm_hidden.weight": _norm(0.0, gen),
        "mtp.norm.weight": _norm(0.0, gen),
    }
    for name, tensor in donor.items():
        if name.startswith("model.layers."):
            extra["mtp." + name.removeprefix("model.")] = tensor
    _add_tensors(out_dir, extra)
    _patch_config(out_dir, {key: n})
    return out_dir


def save_qwen3_next_mtp(
    out_dir: Path,
    *,
    layers: int = 2,
    mtp_layers: int = 1,
    seed: int = 0,
    linear_attention: bool = True,
    tuning: Tuning = Tuning(),
) -> Path:
    """Save a tiny Qwen3-Next with `mtp.*` weights; `num_nextn_predict_layers` declares them (vLLM's key)."""
    target = qwen3_next_config(layers, linear_attention=linear_attention)
    block = qwen3_next_config(mtp_layers, linear_attention=False)
    return _save_mtp_prefixed(out_dir, target, block, seed, tuning, "num_nextn_predict_layers", mtp_layers)


def save_qwen3_5_mtp(
    out_dir: Path,
    *,
    layers: int = 2,
    mtp_layers: int = 1,
    seed: int = 0,
    moe: bool = False,
    linear_attention: bool = True,
    tuning: Tuning = Tuning(),
) -> Path:
    """Save a tiny text-only Qwen3.5 (or -MoE) with `mtp.*` weights at the top level, declared by
    `mtp_num_hidden_layers` as the published configs do."""
    target = qwen3_5_config(layers, moe=moe, linear_attention=linear_attention)
    block = qwen3_5_config(mtp_layers, moe=moe, linear_attention=False)
    return _save_mtp_prefixed(out_dir, target, block, seed, tuning, "mtp_num_hidden_layers", mtp_layers)
