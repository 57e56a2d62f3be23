"""The models being evaluated, torch only: the DFlash drafter as `nn.Module`s with one `forward`
that drafts any number of blocks against one or several cached contexts (`model.py`) and its
configuration (`config.py`); the EAGLE-3 drafter (`eagle3.py`) and its layout-independent
configuration (`eagle3_config.py`).
"""
