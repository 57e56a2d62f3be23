"""5. The model being evaluated: the DFlash drafter as `nn.Module`s with one `forward` that drafts
any number of blocks against one or several cached contexts (`model.py`), and its configuration
(`config.py`). torch only."""
