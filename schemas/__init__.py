"""Wire models shared by the cache server and the eval workers."""

from schemas.errors import ErrorBody, ErrorDetail
from schemas.hidden import HiddenMetadata, HiddenResult, TargetHeads
from schemas.jobs import Claim, JobState, JobStatus, JobSubmit
from schemas.model import LAYER_CONVENTION, ModelInfo
from schemas.prompts import GenerateSpec, PromptPage, PromptSpec, PromptState, PromptStatus, RegisterRequest
from schemas.report import EvalReport, EvalSummary, PromptEval, RoundTaus, TauSummary

__all__ = [
    "LAYER_CONVENTION",
    "Claim",
    "ErrorBody",
    "ErrorDetail",
    "EvalReport",
    "EvalSummary",
    "GenerateSpec",
    "HiddenMetadata",
    "HiddenResult",
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
    "TargetHeads",
    "TauSummary",
]
