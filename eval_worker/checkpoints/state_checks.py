"""The checks every drafter state dict passes before `load_state_dict(strict=True)`: the key set the
config implies, and each tensor's shape and float dtype (messages name the tensor and the shapes)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import torch
from torch import Tensor, nn

from eval_worker.errors import CheckpointRefused

Shapes = Mapping[str, tuple[int, ...]]


def module_shapes(build: Callable[[], nn.Module], *, skip: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """Every tensor of the module `build` makes, in state-dict order, read off a copy built on the meta
    device (no memory, no init): the model code is the one list of what a checkpoint must hold."""
    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in skip}


def check_key_set(state: Mapping[str, Tensor], expected: Shapes, *, optional: Collection[str] = ()) -> None:
    """CheckpointRefused unless `state` holds every expected key and nothing but them (and `optional`)."""
    missing = [k for k in expected if k not in state]
    unexpected = sorted(k for k in state if k not in expected and k not in optional)
    if missing or unexpected:
        raise CheckpointRefused(
            f"state dict does not match the config: missing keys {missing}, unexpected keys {unexpected}"
        )


def check_shapes(state: Mapping[str, Tensor], expected: Shapes) -> None:
    """CheckpointRefused unless every expected tensor has its shape and a float dtype."""
    for name, shape in expected.items():
        got = tuple(state[name].shape)
        if got != shape:
            raise CheckpointRefused(f"tensor {name} has shape {list(got)}, the config needs {list(shape)}")
        if not state[name].is_floating_point():
            raise CheckpointRefused(f"tensor {name} has dtype {state[name].dtype}, expected a float dtype")
