"""Load drafter checkpoints - strictly, or not at all - whatever their family (the table in
`families/` tells them apart by their config and loads each its own way): anything that would not load with
`strict=True` into a drafter fitting the target raises `CheckpointRefused` naming the tensor, the
shapes and the layer ids. Options given for another family than the checkpoint's are refused, never
ignored.
"""

from __future__ import annotations

from pathlib import Path

from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint, LoadRequest
from eval_worker.checkpoints.raw import RawCheckpoint, read_raw
from eval_worker.errors import CheckpointRefused
from eval_worker.families import FAMILIES, DrafterFamily, family_of
from schemas.eval_spec import FAMILY_TITLES, EvalSpec
from schemas.layers import layer_list_problem
from schemas.model import ModelInfo


def request_of(spec: EvalSpec) -> LoadRequest:
    """What loading reads of a spec: layer ids for a checkpoint that names none, the family's options,
    config keys to accept as inert."""
    ids = tuple(spec.target_layer_ids) if spec.target_layer_ids is not None else None
    return LoadRequest(ids, spec.family_options, frozenset(spec.inert_config_keys))


def detect(path: Path, config_path: Path | None = None) -> tuple[RawCheckpoint, DrafterFamily]:
    """The checkpoint as read from disk (`config_path`: a config for a torch.save file without one), and
    its family (CheckpointRefused when no family, or several, claim its config)."""
    raw = read_raw(path, config_path)
    return raw, family_of(raw.config)


def check_options(path: Path, family: DrafterFamily, request: LoadRequest) -> None:
    """CheckpointRefused (naming both families) when the request's options are another family's."""
    options = request.options
    if options is not None and not isinstance(options, family.options):
        given = sorted(options.model_dump(exclude_defaults=True, exclude={"family"}))
        said = f" ({', '.join(given)})" if given else ""
        raise CheckpointRefused(
            f"{path} is a drafter of the {family.title} family: the options given{said} are the "
            f"{FAMILY_TITLES[options.family]} family's"
        )


def load_detected(
    path: Path, raw: RawCheckpoint, family: DrafterFamily, target: ModelInfo, request: LoadRequest
) -> LoadedCheckpoint:
    """A detected checkpoint loaded strictly for `target` by its family (`check_options` first)."""
    check_options(path, family, request)
    return family.load(path, raw, target, request)


def load_checkpoint(
    path: Path, target: ModelInfo, request: LoadRequest | None = None, config_path: Path | None = None
) -> LoadedCheckpoint:
    """A drafter that fits `target`, loaded strictly from `path` (a HF dir or a torch.save file).

    `request.layer_ids` (decoder outputs) is only for checkpoints that name no layers (one that
    contradicts them is refused); `request.options` must be the checkpoint's family's (a DFlash block
    length or mask token, the convention to read EAGLE-3 ids in, ...)."""
    raw, family = detect(path, config_path)
    return load_detected(path, raw, family, target, request or LoadRequest())


def load_with_spec(path: Path, target: ModelInfo, spec: EvalSpec) -> LoadedCheckpoint:
    """`load_checkpoint` with what `spec` says of loading (its config file, layer ids, options, inert keys)."""
    return load_checkpoint(path, target, request_of(spec), Path(spec.config) if spec.config is not None else None)


def check_fits_target(checkpoint: LoadedCheckpoint, target: ModelInfo) -> None:
    """Re-check a loaded checkpoint against a (possibly different) target description."""
    FAMILIES[checkpoint.family].check_fits(checkpoint, target)
    problem = layer_list_problem(checkpoint.target_layer_ids, target.num_layers)
    if problem is not None:
        raise CheckpointRefused(
            f"target_layer_ids {list(checkpoint.target_layer_ids)} for target {target.name!r}: {problem}"
        )
