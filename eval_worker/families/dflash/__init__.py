"""DFlash: the drafter, whose one `forward` drafts any number of blocks against one or several cached
contexts (`drafter.py`), its configuration (`config.py`) and config keys as checkpoints write them
(`layout.py`), strict loading for a target (`checkpoint.py`), walk-driven drafting of chains and DDTrees
(`walks.py`) and probabilistic drafting's expected rounds (`probabilistic.py`).
"""
