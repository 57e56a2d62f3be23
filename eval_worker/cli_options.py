"""The option groups `eval-worker`'s commands share, how they become one `EvalSpec` (the family options
into the block of the family they are for), and how a command's settings model becomes its options
(each also an EVAL_WORKER_ variable)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from cache_server.cli_source import settings_from
from schemas.eval_spec import (
    FAMILY_OPTIONS,
    FAMILY_TITLES,
    DrafterFamilyName,
    EvalSpec,
    FamilyOptions,
    families_reading,
)
from schemas.layers import CHECKPOINT_LAYER_CONVENTIONS, REQUEST_LAYER_CONVENTIONS, parse_layer_list
from schemas.sample_formats import EXPORT_FORMATS
from schemas.sampling import DRAFT_SAMPLING
from schemas.trees import EagleTreeShape

Command = Callable[[argparse.Namespace, Any], int]
# The flags that fill a family's options block, by the field of the block each sets.
FAMILY_FLAGS = {
    "tree_budgets": "--tree-budget",
    "block_size": "--block-size",
    "mask_token_id": "--mask-token-id",
    "eagle_trees": "--eagle-tree",
    "steps": "--steps",
    "layer_convention": "--layer-convention",
}


def _titles(families: Iterable[DrafterFamilyName]) -> str:
    return " and ".join(FAMILY_TITLES[f] for f in families)


@dataclass(frozen=True)
class FamilyFlags:
    """The family options given on the command line (block field -> value) and --family: which block they
    fill is the checkpoint's family's (`evaluate`; `submit` where it reads the checkpoint here: `read`),
    else --family's, else the one family all of them fit."""

    given: dict[str, Any]
    family: DrafterFamilyName | None = None
    read: DrafterFamilyName | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> FamilyFlags:
        """The flags `args` holds, their values checked as the blocks check them (ValidationError)."""
        given = {k: getattr(args, k) for k in FAMILY_FLAGS if getattr(args, k, None) not in (None, [])}
        flags = cls(given, getattr(args, "family", None))
        flags.blocks()
        return flags

    def _build(self, family: DrafterFamilyName) -> FamilyOptions:
        block = FAMILY_OPTIONS[family]
        return block(**{k: v for k, v in self.given.items() if k in block.model_fields})

    def _only(self, family: DrafterFamilyName) -> None:
        for field in self.given:
            owners = families_reading(field)
            if family not in owners:
                raise ValueError(f"{FAMILY_FLAGS[field]} applies to {_titles(owners)} drafters, not --family {family}")

    def blocks(self) -> dict[DrafterFamilyName, FamilyOptions | None]:
        """Each family's block from the flags it reads (None: no flag of it given); with --family, that
        family's block for every family (loading refuses a checkpoint of another)."""
        if self.family is not None:
            self._only(self.family)
            block = self._build(self.family)
            return dict.fromkeys(FAMILY_OPTIONS, block)
        reads = {f: any(f in families_reading(k) for k in self.given) for f in FAMILY_OPTIONS}
        return {f: self._build(f) if reads[f] else None for f in FAMILY_OPTIONS}

    def block(self) -> FamilyOptions | None:
        """The one block the flags mean without a checkpoint to ask (`submit`, `watch`): --family's, else
        the one family every flag fits (ValueError when they fit none, or several)."""
        if self.family is not None:
            return self.blocks()[self.family]
        if not self.given:
            return None
        if self.read is not None:  # as `evaluate` fills them: a flag the checkpoint's family does not read is refused
            self.check_used({self.read})
            return self.blocks()[self.read]
        fits = self.fits()
        flags = " and ".join(FAMILY_FLAGS[k] for k in self.given)
        if not fits:
            owners = sorted({o for k in self.given for o in families_reading(k)}, key=list(FAMILY_OPTIONS).index)
            raise ValueError(
                f"{flags} belong to different drafter families ({_titles(owners)}): give one family's options"
            )
        if len(fits) > 1:
            verb = "apply" if len(self.given) > 1 else "applies"
            raise ValueError(f"{flags} {verb} to {_titles(fits)} drafters: say which with --family")
        return self._build(fits[0])

    def fits(self) -> list[DrafterFamilyName]:
        """The families that read every flag given."""
        return [f for f in FAMILY_OPTIONS if all(f in families_reading(k) for k in self.given)]

    def check_used(self, families: Collection[str]) -> None:
        """ValueError for a flag that applies to none of `families` (the checkpoints'): refused, not ignored."""
        for field in self.given:
            owners = families_reading(field)
            if not set(owners) & set(families):
                raise ValueError(
                    f"{FAMILY_FLAGS[field]} applies to {_titles(owners)} drafters; none of these checkpoints is one"
                )


def eval_spec(
    args: argparse.Namespace, family_options: FamilyOptions | None = None, config: str | None = None
) -> EvalSpec:
    """The options of `args` that are no family's (those that `args` lacks at their defaults), with
    `family_options` and `config` (default: --config as given)."""
    given_config = getattr(args, "config", None)
    return EvalSpec(
        target_layer_ids=getattr(args, "target_layer_ids", None),
        sets=getattr(args, "sets", None) or [],
        draft_sampling=getattr(args, "draft_sampling", None) or "greedy",
        config=config if config is not None else (str(given_config) if given_config is not None else None),
        inert_config_keys=getattr(args, "inert_config_keys", None) or [],
        family_options=family_options,
    )


def layer_ids(text: str) -> list[int]:
    """`--...-layer-ids 1,16,31` as a list (argparse's error for anything else)."""
    try:
        return parse_layer_list(text, "layer ids")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _eagle_tree(text: str) -> str:
    try:
        return EagleTreeShape.parse(text).key
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _key_list(text: str) -> list[str]:
    return [k.strip() for k in text.split(",")]


def job_options(p: argparse.ArgumentParser) -> None:
    """What to evaluate: shared by `evaluate`, `submit` and `watch` (checked as an `EvalSpec`); the family
    options fill the block of the checkpoint's family (`evaluate`), else of --family or of the flags'."""
    p.add_argument(
        "--family",
        choices=list(FAMILY_OPTIONS),
        help="the drafter family the options below are for (a checkpoint of another is refused); "
        "needed where they fit several (--steps: EAGLE-3 and MTP) and the checkpoint is not read here "
        "(watch; submit of a path only the server sees)",
    )
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
        help="EAGLE-3 and MTP: chain drafts per round (default: the checkpoint's speculative_tokens, else "
        "EAGLE-3 5, MTP 1)",
    )
    p.add_argument(
        "--layer-convention",
        choices=CHECKPOINT_LAYER_CONVENTIONS,
        help="EAGLE-3: read the checkpoint's layer ids in this convention instead of its layout's",
    )
    p.add_argument(
        "--target-layer-ids",
        type=layer_ids,
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
    config_args(p)


def export_options(p: argparse.ArgumentParser) -> None:
    """What `export` writes: the format, the set, the layers and how they are numbered."""
    p.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="specforge-eagle3: input_ids, loss_mask, hidden_state (the last layer after the final norm), "
        "aux_hidden_state; specforge-dflash: input_ids, loss_mask, hidden_states",
    )
    p.add_argument("--set", dest="set_name", required=True, help="the prompt set to export, in the server's order")
    p.add_argument(
        "--layers",
        type=layer_ids,
        required=True,
        help="aux layer ids, comma-separated, concatenated in this order (EAGLE-3: exactly 3; as the draft "
        "config's eagle_aux_hidden_state_layer_ids or dflash_config.target_layer_ids)",
    )
    p.add_argument(
        "--layer-convention",
        choices=REQUEST_LAYER_CONVENTIONS,
        default="decoder_output_0based",
        help="decoder_output_0based (default; SpecForge's own numbering): output of decoder layer i; "
        "hf_index: Hugging Face hidden_states index (i - 1 in the default's)",
    )


def sampling_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How responses are sampled from the target (`GenerateSpec`'s fields): greedy by default."""
    p.add_argument("--temperature", type=float, default=0.0, help="sample at T (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus filter (default 1: off)")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p filter (default 0: off)")
    p.add_argument("--seed", type=int, default=0, help="the first sample's seed (default 0)")
    p.add_argument("--samples", type=int, default=1, help="responses per prompt, sample i seeded seed + i (default 1)")


def config_args(p: argparse.ArgumentParser) -> None:
    """What a user supplies beside a checkpoint whose own config lacks it, or says more than it should."""
    p.add_argument(
        "--config",
        type=Path,
        help="drafter config.json for a torch.save file without one (a job's: under --checkpoint-root)",
    )
    p.add_argument(
        "--mask-token-id",
        type=int,
        help="DFlash: the mask token, for a config that names none (SpecForge writes none unless told)",
    )
    p.add_argument(
        "--inert-config-keys",
        type=_key_list,
        default=[],
        help="comma-separated config keys to accept as not changing the drafter's math (named in the report)",
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
        build = settings_from(p, settings)
    p.set_defaults(func=func, build_settings=build)
    return p
