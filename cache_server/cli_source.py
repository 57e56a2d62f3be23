"""A settings model's fields as a command's options, for both commands (`cache-server` and `eval-worker`):
each option's help says its default once.

pydantic-settings appends `(default: None)` to every field that defaults to None, also where the
description already says what the unset field means (`(default: the only one)`); None itself tells a
reader nothing, so that suffix is dropped and a stated default (or none) is what `--help` shows.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic_settings import BaseSettings, CliSettingsSource

S = TypeVar("S", bound=BaseSettings)


class OptionsSource(CliSettingsSource[S]):
    """`CliSettingsSource` whose help leaves out pydantic-settings' `(default: None)`."""

    def _help_format(self, *args: Any, **kwargs: Any) -> str:
        text = super()._help_format(*args, **kwargs)
        return re.sub(rf" ?\(default: {re.escape(self.cli_parse_none_str)}\)", "", text)


def settings_from(parser: argparse.ArgumentParser, cls: type[S]) -> Callable[[argparse.Namespace], S]:
    """Add `cls`'s fields to `parser` as options; returns how to build the settings from parsed args."""
    source: OptionsSource[S] = OptionsSource(cls, root_parser=parser)
    return lambda args: cls(_cli_settings_source=source(parsed_args=args))
