"""7. Jobs, worker side: claim, evaluate and report under a lease (`job_worker.py`), and finding
finished checkpoints to submit (`watch.py`)."""
