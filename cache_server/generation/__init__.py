"""The serving engine: its OpenAI-compatible completions API asked for token ids (`engine.py`), the
checks it passes at startup as a generator (`startup.py`), the requests in flight on it while the
target captures (`engine_stage.py`); and the engine as the capturer (`engine_capture.py`) of a target
whose weights this server never loads (`engine_target.py`), through the files its hidden-states
connector writes (`capture_files.py`). In-process generation is the target's (`capture/hf_forward.py`)."""
