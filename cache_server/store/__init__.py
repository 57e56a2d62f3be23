"""The Zarr store: per-prompt, per-layer hidden states published under a target's fingerprint
(`hidden_store.py`, `publish.py`) in a local directory or an S3 bucket (`blobs.py`, `s3_blobs.py`; the
one a location names: `locations.py`), with durable local writes (`durable.py`), their manifest
(`manifest.py`) and hierarchy (`hierarchy.py`), the codec and array objects (`chunks.py`), reads
without zarr (`blosc_reader.py`, `reader.py`), stored rows from RAM or the objects (`stored_rows.py`),
decoded layers kept in RAM (`ram_cache.py`), an FP8 store's quantizer and scales (`fp8.py`), orphans
of interrupted writes (`recovery.py`), layers dropped by `cache-server prune` (`prune.py`) and its
record of what it will delete (`prune_record.py`), a store opened read-only (`read_only.py`), and the
codec ratio measured, the bytes stored and the free space a store has (`usage.py`). Its errors are one
tree (`errors.py`).
"""
