"""EAGLE-3 drafters for tests and the demo: build one for a tiny target, give it a draft vocab, save it in
each published layout (EAGLE, SpecForge, speculators; HF directory or `torch.save` dict), train it briefly."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from eval_worker.families.eagle3.config import Eagle3Config
from eval_worker.families.eagle3.drafter import Eagle3Context, Eagle3Drafter, NodeBatch
from schemas.checkpoint_layout import HF_CONFIG, HF_WEIGHTS, TRAINER_STATE
from testing.tiny_trainer import attention_shape

SaveLayout = Literal["eagle", "specforge", "speculators"]


def eagle3_config(target_config: Any, *, draft_vocab_size: int | None = None, **flags: Any) -> Eagle3Config:
    """A drafter shaped like the tiny target's attention (HF Qwen3 config), with the given math flags."""
    t = target_config
    cfg = Eagle3Config(
        **attention_shape(t),
        vocab_size=t.vocab_size,
        draft_vocab_size=draft_vocab_size or t.vocab_size,
        target_hidden_size=t.hidden_size,
    )
    return replace(cfg, **flags)


def frequent_d2t(token_ids: Sequence[Tensor], size: int, vocab_size: int) -> Tensor:
    """The `size` most frequent target ids as the draft vocab (sorted; unseen ids fill it up), as d2t offsets."""
    counts = Counter(int(t) for ids in token_ids for t in ids)
    ranked = [t for t, _ in counts.most_common()] + [t for t in range(vocab_size) if t not in counts]
    return torch.tensor(sorted(ranked[:size])) - torch.arange(size)


def random_eagle3(
    cfg: Eagle3Config, num_taps: int, *, seed: int = 0, d2t: Tensor | None = None, has_embed: bool = False
) -> Eagle3Drafter:
    """An untrained drafter with non-trivial norm weights (so a misplaced norm shows)."""
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(cfg, num_taps, has_embed=has_embed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            elif "fc" in name or "lm_head" in name:
                p.normal_(0.0, 0.3)
        if d2t is not None:
            drafter.d2t.copy_(d2t)
    return drafter.eval()


def train_eagle3(
    drafter: Eagle3Drafter,
    token_ids: Sequence[Tensor],
    taps: Sequence[Tensor],
    embed: Tensor,
    steps: int,
    *,
    lr: float = 3e-3,
    depth: int = 1,
) -> float:
    """Teacher-forced training of the first `depth` drafting steps: the output at position i (taps i,
    token i+1) predicts token i+2, and the step-j node of a round anchored at s (fed the step before's
    output and token s+j-1) predicts token s+j (target ids outside the draft vocab are not scored).
    Returns the last loss."""
    vocab_of = torch.full((drafter.cfg.vocab_size,), -100)
    vocab_of[drafter.to_target(torch.arange(drafter.cfg.draft_vocab_size))] = torch.arange(drafter.cfg.draft_vocab_size)
    optimizer = torch.optim.Adam([p for n, p in drafter.named_parameters() if n != "embed_tokens.weight"], lr=lr)
    drafter.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        optimizer.zero_grad()
        losses = []
        for ids, t in zip(token_ids, taps, strict=True):
            ctx = drafter.prefill(t, ids, embed)
            pairs = [(drafter.logits(ctx.roots[:-1]), ids[2:]), *_later_steps(drafter, ctx, ids, embed, depth)]
            losses += [F.cross_entropy(logits, vocab_of[want], ignore_index=-100) for logits, want in pairs]
        loss = torch.stack(losses).mean()
        loss.backward()
        optimizer.step()
    drafter.eval()
    return float(loss.detach())


def _later_steps(
    drafter: Eagle3Drafter, ctx: Eagle3Context, ids: Tensor, embed: Tensor, depth: int
) -> list[tuple[Tensor, Tensor]]:
    """(logits, wanted target ids) of steps 2..depth of every round whose tokens exist, as the live loop
    runs them: the node of step j sits at position s+j-2, sees the context before s, its ancestors and itself."""
    s = torch.arange(1, ctx.roots.shape[0] - depth + 1)  # anchors whose step-`depth` token exists
    m, (nkv, _, d) = len(s), ctx.keys.shape
    hidden = drafter.feedback(ctx.roots[s - 1])[:, None]
    tree_k = tree_v = ctx.keys.new_zeros(m, nkv, 0, d)
    out = []
    for j in range(1, depth):
        visible = torch.ones(m, 1, tree_k.shape[2], dtype=torch.bool)
        batch = NodeBatch(
            ctx.keys[None], ctx.values[None], torch.zeros(m, dtype=torch.long), s, tree_k, tree_v, visible
        )
        x, k, v = drafter.step(hidden, ids[s + j][:, None], s + j - 1, batch, embed)
        out.append((drafter.logits(x[:, 0]), ids[s + j + 1]))
        tree_k, tree_v = torch.cat([tree_k, k], dim=2), torch.cat([tree_v, v], dim=2)
        hidden = drafter.feedback(x)
    return out


def _llama_fields(cfg: Eagle3Config) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "num_hidden_layers": 1, "vocab_size": cfg.vocab_size, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }  # fmt: skip


def eagle3_files(
    drafter: Eagle3Drafter, layout: SaveLayout, *, layer_ids: Sequence[int] | None = None, steps: int | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The config dict and state dict a layout writes. `layer_ids` are written as given (in the layout's own
    convention); the EAGLE layout writes none."""
    cfg = drafter.cfg
    state = {k: v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[drafter.to_target(torch.arange(cfg.draft_vocab_size))] = True
    state["t2d"] = t2d
    config: dict[str, Any]
    if layout == "speculators":
        state = {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in state.items()}
        layer = {k: v for k, v in _llama_fields(cfg).items() if k != "architectures"}
        layer["model_type"] = "qwen3" if cfg.qk_norm else "llama"
        config = {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer,
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "norm_before_residual": cfg.norm_before_residual,
            "norm_before_fc": cfg.feature_norm == "concat",
            "fc_norm": cfg.feature_norm == "per_tap",
            "norm_output": cfg.feed_normed,
            "eagle_aux_hidden_state_layer_ids": list(layer_ids) if layer_ids is not None else None,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": steps or 3}],
                "verifier": {"name_or_path": "tiny", "architectures": ["Qwen3ForCausalLM"]},
            },
        }
        return config, state
    config = _llama_fields(cfg) | {"draft_vocab_size": cfg.draft_vocab_size}
    if layout == "specforge":
        config |= {"fc_norm": cfg.feature_norm == "per_tap", "norm_output": cfg.logits_from_norm}
        if layer_ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    return config, state


def save_eagle3(
    out: Path,
    drafter: Eagle3Drafter,
    layout: SaveLayout,
    *,
    layer_ids: Sequence[int] | None = None,
    steps: int | None = None,
    global_step: int | None = None,
    hf_step: int | None = None,
) -> Path:
    """A HF directory (`out`, with `hf_step` in its `trainer_state.json`), or with `global_step` a training
    `torch.save` dict at `out` with its config."""
    config, state = eagle3_files(drafter, layout, layer_ids=layer_ids, steps=steps)
    if global_step is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model_state_dict": state, "global_step": global_step, "epoch": 0, "config": config}, out)
        return out
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, out / HF_WEIGHTS)
    (out / HF_CONFIG).write_text(json.dumps(config, indent=2))
    if hf_step is not None:
        (out / TRAINER_STATE).write_text(json.dumps({"global_step": hf_step, "epoch": 0}))
    return out
