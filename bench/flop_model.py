"""What evaluating one checkpoint costs in FLOPs, against one target forward over the same prompts.

Multiply-adds x 2; norms, RoPE and softmax are ignored. Per walk over a response of R tokens at mean
acceptance tau: R / tau rounds. The live loop drafts one block per round and projects all B-1 draft
positions through lm_head. Drafting every anchor (the old evaluator) drafts R blocks and projects
R * (B-1) positions. Walk-driven drafting drafts one block per round and projects, for the chain, the
matched positions plus the one that missed (min(tau, B-1) per round), for DDTree-b min(b, B-1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A Qwen3-style decoder stack and its vocabulary."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def layer_per_token(self) -> int:
        """q/k/v/o projections and the SwiGLU MLP of one token through one layer."""
        h, qd, kvd = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * h * (2 * qd + 2 * kvd) + 6 * h * self.intermediate

    def lm_head_row(self) -> int:
        """One position through lm_head."""
        return 2 * self.hidden * self.vocab

    def attention(self, queries: int, keys: int) -> int:
        """Scores and weighted values of `queries` against `keys`, all heads."""
        return 4 * self.heads * self.head_dim * queries * keys

    def with_layers(self, layers: int) -> Shape:
        """The same layer shape, `layers` deep (a drafter built on the target's dimensions)."""
        return Shape(layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate, self.vocab)


def target_forward(t: Shape, total: int) -> int:
    """One causal forward over `total` tokens with logits (what a no-cache evaluation reruns)."""
    causal_pairs = total * (total + 1) // 2
    return total * (t.layers * t.layer_per_token() + t.lm_head_row()) + t.layers * t.attention(1, causal_pairs)


@dataclass(frozen=True)
class Work:
    """Drafter work for one sequence: blocks drafted and positions projected through lm_head."""

    blocks: float
    lm_head_rows: float


def live_loop(response: int, tau: float, block: int, walks: int) -> Work:
    """`walks` live speculative loops (chain, trees) over a response: B-1 positions per round each."""
    rounds = walks * response / tau
    return Work(rounds, rounds * (block - 1))


def all_anchor(response: int, block: int, depth: int) -> Work:
    """Every anchor drafted once, `depth` positions projected each (B-1 when trees need them all)."""
    return Work(response, response * depth)


def walk_driven(response: int, tau: float, block: int, tree_budgets: tuple[int, ...]) -> Work:
    """One block per round per walk (an upper bound: walks that meet share a block)."""
    rounds = response / tau
    chain_rows = rounds * min(tau, block - 1)
    tree_rows = sum(rounds * min(b, block - 1) for b in tree_budgets)
    return Work(rounds * (1 + len(tree_budgets)), chain_rows + tree_rows)


def drafter_flops(d: Shape, taps: int, block: int, total: int, work: Work, mean_context: float) -> float:
    """FLOPs of `work` on one sequence of `total` tokens: fc and context k/v once per token, then the
    blocks (their layers and attention over `mean_context` keys) and the lm_head rows."""
    kvd = d.kv_heads * d.head_dim
    context = total * (2 * taps * d.hidden * d.hidden + d.layers * 4 * d.hidden * kvd)
    per_block = block * d.layers * d.layer_per_token() + d.layers * d.attention(block, int(mean_context) + block)
    return context + work.blocks * per_block + work.lm_head_rows * d.lm_head_row()


QWEN3_8B = Shape(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151936)
QWEN3_32B = Shape(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)
PUBLISHED = [
    # (label, target, drafter layers, taps, block size)
    ("Qwen3-8B-DFlash-b16 (36L H=4096, drafter 5L, B=16)", QWEN3_8B, 5, 5, 16),
    ("64L H=5120 target, 1L drafter, B=16", QWEN3_32B, 1, 5, 16),
]


def published_table(prompt_len: int = 512, response: int = 2048, taus: tuple[float, ...] = (3, 6, 9)) -> str:
    """Per checkpoint: drafted blocks and lm_head rows per walk-round, and warm cost / target forward."""
    total = prompt_len + response
    lines = [
        f"FLOP accounting per prompt ({prompt_len} prompt + {response} response tokens), chain (+ DDTree-8):",
        f"{'shape':<52} {'tau':>4} {'blocks/round':>12} {'rows vs live':>12} "
        f"{'warm/target chain':>18} {'+DDTree-8':>10} {'all-anchor/target':>18} {'live/target':>12}",
    ]
    for label, target, layers, taps, block in PUBLISHED:
        d = target.with_layers(layers)
        forward = target_forward(target, total)
        mean_context = prompt_len + response / 2
        for tau in taus:
            chain = walk_driven(response, tau, block, ())
            trees = walk_driven(response, tau, block, (8,))
            live = live_loop(response, tau, block, 1)
            every = all_anchor(response, block, block - 1)
            walk_rounds = response / tau
            lines.append(
                f"{label:<52} {tau:4.0f} {chain.blocks / walk_rounds:12.2f} "
                f"{chain.lm_head_rows / live.lm_head_rows:12.2f} "
                f"{drafter_flops(d, taps, block, total, chain, mean_context) / forward:18.3f} "
                f"{drafter_flops(d, taps, block, total, trees, mean_context) / forward:10.3f} "
                f"{drafter_flops(d, taps, block, total, every, mean_context) / forward:18.3f} "
                f"{drafter_flops(d, taps, block, total, live, mean_context) / forward:12.3f}"
            )
    return "\n".join(lines)


LLAMA31_8B = Shape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)


def eagle3_flops(t: Shape, draft_vocab: int, total: int, forwards: float, lm_rows: float, mean_context: float) -> float:
    """An EAGLE-3 drafter (one layer on the target's shape, q/k/v reading 2H) over one sequence: fc and the
    layer once per token on target features (the causal pass that gives every round's context and first
    draft), then `forwards` single-position steps and `lm_rows` positions through its lm_head [Vd, H]."""
    h, qd, kvd = t.hidden, t.heads * t.head_dim, t.kv_heads * t.head_dim
    layer = 2 * (2 * h) * (qd + 2 * kvd) + 2 * qd * h + 6 * h * t.intermediate
    pass_ = total * (2 * 3 * h * h + layer) + t.attention(1, total * (total + 1) // 2)
    steps = forwards * (layer + t.attention(1, int(mean_context)))
    return pass_ + steps + lm_rows * 2 * h * draft_vocab


def eagle3_table(
    prompt_len: int = 512,
    response: int = 2048,
    steps: int = 7,
    tree: tuple[int, int, int] = (10, 7, 60),
    taus: tuple[float, ...] = (3, 5, 7),
    draft_vocab: int = 32000,
) -> str:
    """EAGLE-3 on Llama-3.1-8B: the offline walk's chain (drafting stops at the first miss), EAGLE's
    tree (drafted whole: 1 + depth steps of top_k nodes per round) and the live chain, vs a target forward."""
    t, total = LLAMA31_8B, prompt_len + response
    k, depth, _ = tree
    forward = target_forward(t, total)
    mean_context = prompt_len + response / 2
    lines = [
        f"EAGLE-3 on Llama-3.1-8B (32L H=4096, draft vocab {draft_vocab}), {prompt_len} + {response} tokens, "
        f"chain of {steps} and tree {k},{depth},{tree[2]}, FLOPs / one target forward:",
        f"{'tau':>4} {'offline chain':>14} {'+ tree':>8} {'live chain':>11}",
    ]
    for tau in taus:
        rounds = response / tau
        chain_rows = rounds * min(tau, steps)  # the matched drafts and the miss (the first comes with the pass)
        chain = eagle3_flops(t, draft_vocab, total, chain_rows - rounds, chain_rows, mean_context)
        tree_cost = eagle3_flops(t, draft_vocab, 0, rounds * depth * k, rounds * (1 + depth * k), mean_context)
        live = eagle3_flops(t, draft_vocab, total, rounds * (steps - 1), rounds * steps, mean_context)
        lines.append(f"{tau:4.0f} {chain / forward:14.3f} {(chain + tree_cost) / forward:8.3f} {live / forward:11.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(published_table())
    print()
    print(eagle3_table())
