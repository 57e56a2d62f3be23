"""2. What to compute, once: prompt registrations (`registry.py`), the single-flight batching
scheduler that claims work and runs the target (`scheduler.py`), the prompts on their way to a capture
batch while their responses are generated (`responses.py`), and the service the HTTP routes call
(`service.py`)."""
