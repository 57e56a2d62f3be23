"""5. The model being evaluated: the DFlash drafter as `nn.Module`s (`model.py`), its configuration
(`config.py`), and drafting many anchors of a sequence at once (`batched.py`). torch only."""
