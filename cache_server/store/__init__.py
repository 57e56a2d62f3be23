"""3. The Zarr store: per-prompt, per-layer hidden states published atomically under a target's
fingerprint (`hidden_store.py`, `publish.py`), their manifest (`manifest.py`), the codec and array
writes (`chunks.py`), reads without zarr (`blosc_reader.py`, `reader.py`), and what an interrupted
write leaves behind (`recovery.py`)."""
