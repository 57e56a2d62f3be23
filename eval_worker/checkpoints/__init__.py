"""Drafter checkpoints, whatever their family: read from disk (`raw.py`) and loaded strictly for a
target (`loading.py`, asking the family table which family a checkpoint is; what a load gives back:
`loaded_checkpoint.py`); every config key honoured, inert or refused (`config_keys.py`) and every tensor checked
(`state_checks.py`); which target layers the fc reads and where that answer came from
(`layer_ids.py`); `eval-worker inspect` (`info.py`). Each family's own loader is in its folder under
`families/`.
"""
