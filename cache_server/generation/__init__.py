"""Responses from a serving engine: its OpenAI-compatible completions API asked for token ids
(`engine.py`), the checks it passes at startup (`startup.py`), and the requests in flight on it while
the target captures (`engine_stage.py`). In-process generation is the target's (`capture/target.py`)."""
