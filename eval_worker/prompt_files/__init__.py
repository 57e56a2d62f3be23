"""Benchmark prompt files (gsm8k, humaneval, mt-bench, ...) read into prompt sets on the cache server."""
