"""What route handlers receive: the service, its tensor responses, the job queue and the checkpoint root
of the app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from cache_server.api.tensor_bodies import TensorBodies
from cache_server.compute.service import HiddenStateService
from cache_server.jobs.queue import JobStore


def get_service(request: Request) -> HiddenStateService:
    """The app's hidden-state service (opened in the lifespan)."""
    return request.app.state.service


def get_tensors(request: Request) -> TensorBodies:
    """The app's tensor responses (`/hidden`, `/target/heads`)."""
    return request.app.state.tensors


def get_jobs(request: Request) -> JobStore:
    """The app's job queue (opened in the lifespan)."""
    return request.app.state.jobs


def get_checkpoint_root(request: Request) -> Path | None:
    """The directory jobs may evaluate checkpoints under; None: jobs are refused."""
    return request.app.state.checkpoint_root


ServiceDep = Annotated[HiddenStateService, Depends(get_service)]
TensorsDep = Annotated[TensorBodies, Depends(get_tensors)]
JobsDep = Annotated[JobStore, Depends(get_jobs)]
RootDep = Annotated[Path | None, Depends(get_checkpoint_root)]
