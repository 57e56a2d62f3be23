"""Errors raised by the eval worker; every one of them stops the run.

EvalWorkerError
 ├── CheckpointRefused   the checkpoint does not load strictly or does not fit the target
 ├── FeatureMismatch     served features are not the ones requested (layers, target, shape)
 ├── NothingToWalk       no prompt (of the run, or of a set) has a response to draft on (a ValueError)
 └── WalkStopped         the walk was stopped before its end (a cancelled job)
"""

from __future__ import annotations


class EvalWorkerError(Exception):
    """Base class of every eval-worker error."""


class CheckpointRefused(EvalWorkerError):
    """The drafter checkpoint is incomplete, inconsistent, or built for another target/feature layout."""


class FeatureMismatch(EvalWorkerError):
    """The hidden states served do not match the layers, target or shape that were requested."""


class NothingToWalk(EvalWorkerError, ValueError):
    """None of the prompts asked for has a response to draft on: finished chats, registered to train on."""


class WalkStopped(EvalWorkerError):
    """A checkpoint's walk was stopped before its end (`WalkProgress.stop`: its job was cancelled)."""
