"""Our drafter against a reference assembled from transformers' own Qwen3 building blocks."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    repeat_kv,
    rotate_half,
)

from eval_worker.families.dflash.drafter import DFlashDrafter, draft_block
from tests.eval_worker.helpers import random_drafter, small_config


def _hf_norm(weight: Tensor, eps: float) -> Qwen3RMSNorm:
    norm = Qwen3RMSNorm(weight.shape[0], eps=eps)
    norm.weight.data.copy_(weight)
    return norm


def reference_block(drafter: DFlashDrafter, taps: Tensor, block: Tensor, embed: Tensor, head: Tensor) -> Tensor:
    """The published forward, step by step, with HF's RMSNorm / RoPE / MLP / repeat_kv; [B-1, V]."""
    cfg = drafter.cfg
    hf = Qwen3Config(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )
    eps, d = cfg.rms_norm_eps, cfg.head_dim
    c, b = taps.shape[0], block.shape[0]
    sd = drafter.state_dict()
    target_hidden = _hf_norm(sd["hidden_norm.weight"], eps)(taps @ sd["fc.weight"].T)[None]  # [1, C, H]
    x = embed[block][None]  # [1, B, H]
    cos, sin = Qwen3RotaryEmbedding(hf)(x, torch.arange(c + b)[None])
    cos, sin = cos[:, None], sin[:, None]  # [1, 1, C+B, D]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        residual = x
        h = _hf_norm(sd[p + "input_layernorm.weight"], eps)(x)
        q = _hf_norm(sd[p + "self_attn.q_norm.weight"], eps)(
            (h @ sd[p + "self_attn.q_proj.weight"].T).view(1, b, -1, d)
        )
        q = q.transpose(1, 2)
        kv_in = torch.cat([target_hidden, h], dim=1)
        k = (kv_in @ sd[p + "self_attn.k_proj.weight"].T).view(1, c + b, -1, d)
        k = _hf_norm(sd[p + "self_attn.k_norm.weight"], eps)(k).transpose(1, 2)
        v = (kv_in @ sd[p + "self_attn.v_proj.weight"].T).view(1, c + b, -1, d).transpose(1, 2)
        q = q * cos[..., -b:, :] + rotate_half(q) * sin[..., -b:, :]
        k = k * cos + rotate_half(k) * sin
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        weights = torch.softmax((q @ k.transpose(2, 3)) * d**-0.5, dim=-1, dtype=torch.float32)
        attn = (weights @ v).transpose(1, 2).reshape(1, b, -1)
        x = residual + attn @ sd[p + "self_attn.o_proj.weight"].T
        mlp = Qwen3MLP(hf)
        mlp.load_state_dict({k.removeprefix(p + "mlp."): t for k, t in sd.items() if k.startswith(p + "mlp.")})
        x = x + mlp(_hf_norm(sd[p + "post_attention_layernorm.weight"], eps)(x))
    x = _hf_norm(sd["norm.weight"], eps)(x)
    return (x[0, 1:] @ head.T).detach()


def test_draft_block_matches_hf_building_blocks() -> None:
    cfg = small_config()
    drafter = random_drafter(cfg, 3)
    torch.manual_seed(1)
    taps, embed, head = torch.randn(11, 96), torch.randn(100, 32), torch.randn(100, 32)
    block = torch.tensor([5] + [cfg.mask_token_id] * (cfg.block_size - 1))
    with torch.no_grad():
        ours = draft_block(drafter, taps, block, embed, head)
    assert ours.shape == (cfg.block_size - 1, 100)
    torch.testing.assert_close(ours, reference_block(drafter, taps, block, embed, head), rtol=1e-5, atol=1e-5)


def test_context_is_not_masked_and_block_is_bidirectional() -> None:
    """Changing the last context tap or a later block token changes the first draft position."""
    cfg = small_config()
    drafter = random_drafter(cfg, 3)
    torch.manual_seed(2)
    taps, embed, head = torch.randn(6, 96), torch.randn(100, 32), torch.randn(100, 32)
    block = torch.tensor([5] + [cfg.mask_token_id] * (cfg.block_size - 1))
    with torch.no_grad():
        base = draft_block(drafter, taps, block, embed, head)
        taps2 = taps.clone()
        taps2[-1] += 1.0
        assert not torch.allclose(draft_block(drafter, taps2, block, embed, head)[0], base[0])
        block2 = block.clone()
        block2[-1] = 7
        assert not torch.allclose(draft_block(drafter, taps, block2, embed, head)[0], base[0])
