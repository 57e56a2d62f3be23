"""Tests of `eval_worker.families`."""
