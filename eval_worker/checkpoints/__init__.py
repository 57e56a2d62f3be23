"""Drafter checkpoints: strict loading (`loading.py`) of each family's layouts, DFlash's
(`dflash_layout.py`) and EAGLE-3's (`eagle3_layouts.py`, `eagle3_loading.py`), every config key
honoured, inert or refused (`config_keys.py`) and every tensor checked (`state_checks.py`); which
target layers the fc reads and where that answer came from (`layer_ids.py`); `eval-worker inspect`
(`info.py`).
"""
