"""MTP heads, the multi-token-prediction layers a target ships with: `layouts.py` (where the heads live
in a checkpoint: DeepSeek-V3, Qwen3-Next, Qwen3.5), `drafter.py` (the head, its block transformers' own class),
`checkpoint.py` (strict loading from the target's checkpoint or an MTP-only one) and `walks.py` (the
chain, the one head reused at every step as vLLM runs it)."""
