"""The wire contract shared by the cache server, its clients and the eval workers.

Pydantic models (prompts, jobs, what an evaluation measures, reports), the completions request sent
to a serving engine, the error codes, the layer convention, dtype names and the safetensors framing,
on pydantic + numpy + ml_dtypes only: importing anything here never loads torch.
"""

from schemas.errors import ErrorBody, ErrorCode, ErrorDetail
from schemas.eval_spec import EvalSpec
from schemas.hidden import HiddenMetadata
from schemas.jobs import Claim, JobState, JobStatus, JobSubmit
from schemas.layers import LAYER_CONVENTION
from schemas.model import ModelInfo
from schemas.prompts import (
    GenerateSpec,
    GeneratorInfo,
    PromptPage,
    PromptSpec,
    PromptState,
    PromptStatus,
    RegisterRequest,
)
from schemas.report import EvalReport, EvalSummary, PromptEval, RoundTaus, TauSummary

__all__ = [
    "LAYER_CONVENTION",
    "Claim",
    "ErrorBody",
    "ErrorCode",
    "ErrorDetail",
    "EvalReport",
    "EvalSpec",
    "EvalSummary",
    "GenerateSpec",
    "GeneratorInfo",
    "HiddenMetadata",
    "JobState",
    "JobStatus",
    "JobSubmit",
    "ModelInfo",
    "PromptEval",
    "PromptPage",
    "PromptSpec",
    "PromptState",
    "PromptStatus",
    "RegisterRequest",
    "RoundTaus",
    "TauSummary",
]
