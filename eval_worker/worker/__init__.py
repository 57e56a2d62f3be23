"""Jobs, worker side: claim, evaluate and report under a lease (`job_worker.py`), finding finished
checkpoints to submit (`watch.py`) and their taus as TensorBoard scalars (`tensorboard_log.py`).
"""
