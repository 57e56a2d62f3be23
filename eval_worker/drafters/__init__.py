"""What the drafter families' models are built from, torch only: the RoPE, RMSNorm and MLP
(`layers.py`). Each family's model lives in its own folder under `families/`.
"""
