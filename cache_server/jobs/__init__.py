"""Checkpoint-evaluation jobs, server side: the SQLite queue with leases (`queue.py`), submission
checks (`intake.py`) and where a checkpoint may live (`checkpoint_paths.py`)."""
