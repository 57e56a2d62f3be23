"""Orchestration with no HTTP of its own: features from a `FeatureSource` (`source.py`), kept resident
and fetched ahead (`feature_cache.py`), the target's heads cached on disk (`heads_cache.py`), what must
hold before any math (`checks.py`), which prompts have a response to walk (`responses.py`), how to
evaluate (`options.py`), what every family's walks share (`walk_types.py`), the waves the EAGLE-3 and
MTP walks are driven in (`waves.py`), what probabilistic drafting shares (`probabilistic.py`), one
checkpoint's walks of a chunk of prompts (`prompt_walks.py`), checkpoints evaluated over prompts
(`evaluate.py`), how far their walk is (`progress.py`), checkpoints against a cache server (`sweep.py`),
and `eval-worker doctor` (`doctor.py`). Each family's walks are in its folder under `families/`.
"""
