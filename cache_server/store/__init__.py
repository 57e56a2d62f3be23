"""3. The Zarr store: per-prompt, per-layer hidden states published atomically under a target's
fingerprint (`hidden_store.py`), their manifest (`manifest.py`), chunk codec and reads (`chunks.py`),
and what an interrupted write leaves behind (`recovery.py`)."""
