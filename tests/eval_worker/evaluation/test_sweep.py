"""Defaults of a run against a server that need no server: the drafter's dtype per device."""

from __future__ import annotations

import torch

from eval_worker.evaluation.sweep import drafter_dtype
from eval_worker.settings import EvaluateSettings
from tests.eval_worker.helpers import small_target


def test_the_drafter_runs_in_the_served_dtype_on_a_gpu_and_fp32_on_cpu() -> None:
    served = small_target().model_copy(update={"dtype": "bfloat16"})
    default = EvaluateSettings()
    assert drafter_dtype(default, torch.device("cuda"), served) == torch.bfloat16
    assert drafter_dtype(default, torch.device("cpu"), served) == torch.float32
    exact = EvaluateSettings(dtype="float32")
    assert drafter_dtype(exact, torch.device("cuda"), served) == torch.float32
