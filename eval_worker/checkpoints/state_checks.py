"""The checks every drafter state dict passes before `load_state_dict(strict=True)`: the key set the
config implies, and each tensor's shape and float dtype (messages name the tensor and the shapes)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from torch import Tensor

from eval_worker.errors import CheckpointRefused

Shapes = Mapping[str, tuple[int, ...]]


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
