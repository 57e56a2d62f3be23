"""Checks a job submission against the server before it is queued: checkpoint and config paths, prompts,
layers."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from cache_server.errors import InvalidLayers, InvalidRequest, JobsDisabled, UnknownPrompts, UnknownSets
from cache_server.jobs.checkpoint_paths import resolve_checkpoint, resolve_config
from schemas.jobs import JobSubmit
from schemas.layers import layer_list_problem
from schemas.sampling import trees_problem

_SHOWN = 20  # unknown ids named in a message


@dataclass(frozen=True)
class CheckedJob:
    """A submission that may be queued, and its checkpoint's path relative to the root."""

    spec: JobSubmit  # with `checkpoint` (and `config`) replaced by the resolved absolute paths
    checkpoint_relative: str


def check_submission(
    spec: JobSubmit,
    *,
    root: Path | None,
    is_registered: Callable[[str], bool],
    num_layers: int,
    set_names: Collection[str] = (),
    settings_of: Callable[[JobSubmit], Collection[str]] = lambda _: (),
) -> CheckedJob:
    """The submission with its checkpoint resolved, or the error that refuses it (nothing queued).
    `settings_of` gives the sampling settings of the responses a submission selects."""
    if root is None:
        raise JobsDisabled(
            "this server does not take jobs: start it with --checkpoint-root DIR "
            "(or CACHE_SERVER_CHECKPOINT_ROOT) to evaluate checkpoints under DIR"
        )
    checkpoint = resolve_checkpoint(root, spec.checkpoint)
    resolved = {"checkpoint": str(checkpoint.path)}
    if spec.config is not None:
        resolved["config"] = str(resolve_config(root, spec.config))
    if isinstance(spec.prompts, list):
        unknown = [p for p in spec.prompts if not is_registered(p)]
        if unknown:
            more = f" and {len(unknown) - _SHOWN} more" if len(unknown) > _SHOWN else ""
            raise UnknownPrompts(
                f"prompt ids {unknown[:_SHOWN]}{more} are not registered for this target; "
                "register them with POST /prompts first"
            )
    unknown_sets = [s for s in spec.sets if s not in set_names]
    if unknown_sets:
        raise UnknownSets(f"prompt sets {unknown_sets} do not exist; GET /sets lists them")
    if spec.target_layer_ids is not None:
        problem = layer_list_problem(spec.target_layer_ids, num_layers)
        if problem is not None:
            raise InvalidLayers(f"target_layer_ids: {problem}")
    problem = trees_problem(spec.asks_trees, settings_of(spec))
    if problem is not None:
        raise InvalidRequest(problem)
    return CheckedJob(spec.model_copy(update=resolved), checkpoint.relative.as_posix())
