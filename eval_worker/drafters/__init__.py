"""The models being evaluated, torch only, one file per drafter family: the DFlash drafter, whose one
`forward` drafts any number of blocks against one or several cached contexts (`dflash.py`), and its
configuration (`dflash_config.py`); the EAGLE-3 drafter (`eagle3.py`) and its layout-independent
configuration (`eagle3_config.py`); the RoPE, RMSNorm and MLP both are built from (`layers.py`).
"""
