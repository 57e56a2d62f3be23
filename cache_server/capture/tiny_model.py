"""Build a tiny random Qwen3-architecture target with a real byte-level BPE tokenizer, offline.

Used by the demo and the tests: it loads with `AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)` like any hub model, and nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Rows of the embedding table the tokenizer never emits, like Qwen3's spare ids: a drafter's mask token.
SPARE_ROWS = 8
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + SPARE_ROWS + 32

# ChatML, with Qwen3's switch: `enable_thinking=False` opens the answer with an empty think block.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

_CORPUS = """\
def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)

class Stack:
    def __init__(self):
        self.items = []
    def push(self, item):
        self.items.append(item)
    def pop(self):
        return self.items.pop()

The quick brown fox jumps over the lazy dog. Speculative decoding drafts several tokens
and lets the target model verify them in one forward pass. A drafter reads the hidden states
of the target from a few layers, concatenated and projected into its own width.
for i in range(10):
    print(i * i, "squared")
import numpy as np
x = np.arange(16).reshape(4, 4)
print(x.sum(axis=0))
Question: what is the capital of France? Answer: Paris is the capital of France.
"""


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a small embedded corpus (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - SPARE_ROWS,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def tiny_config(layers: int, hidden: int, vocab: int, head_dim: int = 16) -> Qwen3Config:
    """A small Qwen3 config: `layers` decoder layers of width `hidden` in heads of `head_dim`, untied heads."""
    heads = max(2, hidden // head_dim)
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden // heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def build_tiny_model(
    out_dir: Path,
    *,
    layers: int = 8,
    hidden: int = 64,
    vocab: int = 512,
    seed: int = 0,
    head_dim: int = 16,
    logit_scale: float = 1.0,
) -> Path:
    """Write a random Qwen3 causal LM and its tokenizer to `out_dir` in HF format. vLLM's CPU attention
    takes head_dim 32 and up, not 16 (e.g. hidden 128, head_dim 32). `logit_scale` multiplies lm_head:
    a random model's next-token distribution is nearly flat, a trained one's is peaked, and sampling
    at T > 0 only means something on a peaked one (8 gives a few likely tokens per position)."""
    if vocab < MIN_VOCAB:
        raise ValueError(f"--vocab must be at least {MIN_VOCAB} (256 bytes + special tokens + spare rows)")
    if hidden % 16 or hidden < 32:
        raise ValueError("--hidden must be a multiple of 16 and at least 32")
    if layers < 1:
        raise ValueError("--layers must be at least 1")
    if head_dim % 16 or hidden % head_dim or hidden // head_dim < 2:
        raise ValueError("--head-dim must be a multiple of 16 that divides --hidden into at least 2 heads")
    tokenizer = build_tokenizer(vocab)
    config = tiny_config(layers, hidden, vocab, head_dim)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    # Larger-than-default init so the random model's greedy continuations are varied, not one token.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None  # tiny random models should not stop early
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
