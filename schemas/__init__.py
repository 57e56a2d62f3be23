"""The wire contract shared by the cache server, its clients and the eval workers, on pydantic + numpy
+ ml_dtypes only: importing anything here never loads torch.

Bodies: prompts (`prompts.py`), the target (`model.py`), the tensor endpoints (`hidden.py`,
`pieces.py` with the stored blocks' checksums `block_digests.py`, framed by `safetensors_frame.py`),
jobs (`jobs.py`), what an evaluation measures
(`eval_spec.py`, each drafter family's options a block of it; EAGLE trees in `trees.py`), its report
(`report.py`, each family's drafting a block of it) and the parity report
(`parity.py`); a capture's storage projected before it starts (`plan.py`) and how it is kept, exact
or FP8 (`storage.py`, its values `fp8.py`); the completions request sent to a serving engine
(`completions.py`) and how a response is sampled from the target (`sampling.py`); which tokens a drafter
trains on (`loss_mask.py`) and the layouts its training samples take (`sample_formats.py`); the error
codes (`errors.py`); what a layer id means (`layers.py`); dtype and device names (`dtypes.py`); a string
option checked against its choices (`choices.py`); and what a checkpoint looks like on disk
(`checkpoint_layout.py`).
"""

from schemas.errors import ErrorBody, ErrorCode, ErrorDetail
from schemas.eval_spec import DFlashOptions, Eagle3Options, EvalSpec, MtpOptions
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
from schemas.report import (
    DFlashDrafting,
    Eagle3Drafting,
    EvalReport,
    EvalSummary,
    MtpDrafting,
    PromptEval,
    RoundTaus,
    TauSummary,
)

__all__ = [
    "LAYER_CONVENTION",
    "Claim",
    "DFlashDrafting",
    "DFlashOptions",
    "Eagle3Drafting",
    "Eagle3Options",
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
    "MtpDrafting",
    "MtpOptions",
    "PromptEval",
    "PromptPage",
    "PromptSpec",
    "PromptState",
    "PromptStatus",
    "RegisterRequest",
    "RoundTaus",
    "TauSummary",
]
