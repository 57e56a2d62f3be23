"""Benchmark prompt files (gsm8k, humaneval, mt-bench, ...): their rows read by `datasets`
(`records.py`) and registered as one prompt set on the cache server (`register.py`), never beside the
same rows rendered otherwise (`same_rendering.py`).
"""
