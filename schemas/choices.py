"""A string option checked against its choices: a value outside them is refused by name, never read as
whichever choice an `if`/`else` chain happens to end with."""

from __future__ import annotations

from typing import TypeVar

C = TypeVar("C", bound=str)


def one_of(value: object, choices: tuple[C, ...], what: str) -> C:
    """`value` as the choice it equals; ValueError naming `what` and the valid choices otherwise."""
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"{what} {value!r} is not one of: {', '.join(choices)}")
