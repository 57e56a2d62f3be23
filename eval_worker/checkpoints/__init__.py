"""Drafter checkpoints: strict loading of every published layout (`loading.py`), which target layers
the fc reads and where that answer came from (`layer_ids.py`), and `eval-worker inspect` (`info.py`)."""
