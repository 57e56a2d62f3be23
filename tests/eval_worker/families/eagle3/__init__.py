"""Tests of `eval_worker.families.eagle3`."""
