"""What the drafter families' models are built from, torch only: the Llama-style shape their configs
share (`shape.py`) and the RoPE, RMSNorm and MLP (`layers.py`). Each family's model lives in its own
folder under `families/`.
"""
