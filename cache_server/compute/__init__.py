"""2. What to compute, once: prompt registrations (`registry.py`), the single-flight batching
scheduler that runs the target and publishes to the store (`scheduler.py`), and the service the
HTTP routes call (`service.py`)."""
