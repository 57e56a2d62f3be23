"""The option groups `eval-worker`'s commands share, and how a command's settings model becomes its
options (each also an EVAL_WORKER_ variable)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic_settings import BaseSettings, CliSettingsSource

from schemas.layers import CheckpointLayerConvention, parse_layer_list
from schemas.sampling import DRAFT_SAMPLING
from schemas.trees import EagleTreeShape

Command = Callable[[argparse.Namespace, Any], int]
S = TypeVar("S", bound=BaseSettings)


def _int_list(text: str) -> list[int]:
    try:
        return parse_layer_list(text, "layer ids")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _eagle_tree(text: str) -> str:
    try:
        return EagleTreeShape.parse(text).key
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def job_options(p: argparse.ArgumentParser) -> None:
    """What to evaluate: shared by `evaluate`, `submit` and `watch` (checked as an `EvalSpec`)."""
    p.add_argument(
        "--tree-budget",
        dest="tree_budgets",
        type=int,
        action="append",
        default=[],
        help="DFlash: DDTree budget (nodes, root excluded); repeat for several",
    )
    p.add_argument("--block-size", type=int, help="DFlash: draft this block length instead of the config's")
    p.add_argument(
        "--eagle-tree",
        dest="eagle_trees",
        type=_eagle_tree,
        action="append",
        default=[],
        help="EAGLE-3: a dynamic tree TOPK,DEPTH,TOTAL as EAGLE's top_k, depth, total_token "
        "(e.g. 10,7,60); repeat for several",
    )
    p.add_argument(
        "--steps",
        type=int,
        help="EAGLE-3: chain drafts per round (default: the checkpoint's speculative_tokens, else 5)",
    )
    p.add_argument(
        "--layer-convention",
        choices=get_args(CheckpointLayerConvention),
        help="EAGLE-3: read the checkpoint's layer ids in this convention instead of its layout's",
    )
    p.add_argument(
        "--target-layer-ids",
        type=_int_list,
        help="layer ids (decoder outputs, 0-based) for a checkpoint that names none",
    )
    p.add_argument(
        "--draft-sampling",
        choices=DRAFT_SAMPLING,
        default="greedy",
        help="greedy (default): the chain walk, vLLM's default drafting, exact on sampled responses too; "
        "probabilistic: also the expected tau under standard rejection sampling with sampled drafts "
        "(drafts every anchor of the response)",
    )


def sampling_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How responses are sampled from the target (`GenerateSpec`'s fields): greedy by default."""
    p.add_argument("--temperature", type=float, default=0.0, help="sample at T (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus filter (default 1: off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p filter (default 0: off)")
    p.add_argument("--seed", type=int, default=0, help="the first sample's seed (default 0)")
    p.add_argument("--samples", type=int, default=1, help="responses per prompt, sample i seeded seed + i (default 1)")


def _settings_from(parser: argparse.ArgumentParser, cls: type[S]) -> Callable[[argparse.Namespace], S]:
    """Add `cls`'s fields to `parser` as options; returns how to build the settings from parsed args."""
    source: CliSettingsSource[S] = CliSettingsSource(cls, root_parser=parser)
    return lambda args: cls(_cli_settings_source=source(parsed_args=args))


def config_args(p: argparse.ArgumentParser) -> None:
    """What a user supplies beside a checkpoint whose own config lacks it."""
    p.add_argument("--config", type=Path, help="drafter config.json for a torch.save file without one")
    p.add_argument(
        "--mask-token-id",
        type=int,
        help="DFlash: the mask token, for a config that names none (SpecForge writes none unless told)",
    )


def command(
    sub: Any, name: str, help: str, func: Command, settings: type[BaseSettings] | None, *, positional: str | None
) -> argparse.ArgumentParser:
    """A sub-command whose settings options (if any) come from `settings`, after its own positional."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help)
    if positional is not None:
        p.add_argument(positional, type=Path)
    build: Callable[[argparse.Namespace], Any] = lambda _: None  # noqa: E731
    if settings is not None:
        build = _settings_from(p, settings)
    p.set_defaults(func=func, build_settings=build)
    return p
