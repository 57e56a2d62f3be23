"""Orchestration with no HTTP of its own: features from a `FeatureSource` (`source.py`), kept resident
and fetched ahead (`feature_cache.py`), the target's heads cached on disk (`heads_cache.py`), what must
hold before any math (`checks.py`), walk-driven drafting (`walks.py`, `eagle_walks.py`), one
checkpoint evaluated over prompts (`evaluate.py`), checkpoints against a cache server (`sweep.py`),
and `eval-worker doctor` (`doctor.py`).
"""
