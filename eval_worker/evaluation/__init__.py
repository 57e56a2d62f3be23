"""Orchestration with no HTTP of its own: features from a `FeatureSource` (`source.py`), the target's
heads cached on disk (`heads_cache.py`), and one checkpoint evaluated over prompts (`evaluate.py`)."""
