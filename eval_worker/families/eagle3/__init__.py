"""EAGLE-3: the drafter (`drafter.py`) and its layout-independent configuration (`config.py`), the
layouts checkpoints are written in (`layouts.py`: EAGLE, SpecForge, speculators), strict loading for a
target (`checkpoint.py`), walk-driven drafting of chains and EAGLE trees (`walks.py`) and probabilistic
drafting's expected rounds (`probabilistic.py`).
"""
