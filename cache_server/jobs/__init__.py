"""Checkpoint-evaluation jobs, server side: the queue with leases (`queue.py`) over the job table
(`rows.py`), submission checks (`intake.py`), where a checkpoint may live (`checkpoint_paths.py`), and
which layer sets done jobs read (`layer_usage.py`).
"""
