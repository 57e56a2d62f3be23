"""Drafter checkpoints, read from disk (`raw.py`) and loaded strictly for a target (`loading.py`,
`loaded.py`), one loader per family: DFlash (`dflash.py`, its config keys in `dflash_layout.py`) and
EAGLE-3 (`eagle3.py`, its layouts in `eagle3_layouts.py`); every config key honoured, inert or
refused (`config_keys.py`) and every tensor checked (`state_checks.py`); which target layers the fc
reads and where that answer came from (`layer_ids.py`); `eval-worker inspect` (`info.py`).
"""
