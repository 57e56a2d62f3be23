"""Prompts with a response to walk. A finished chat (`prompts add --whole-chats`, training data) ends
where its prompt ends: no round is drafted on it and it counts in no tau. A run, or a set of it, with no
response at all is refused before any fetch; a run where some prompts have none is evaluated, and its
report's warnings count them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eval_worker.errors import NothingToWalk
from schemas.prompts import PromptState
from schemas.report import PromptEval

REGISTER_INSTEAD = (
    "finished chats (prompts add --whole-chats) are training data with no response to evaluate; "
    "register the prompts to evaluate without --whole-chats, so that the target generates their responses"
)


def without_response(states: Mapping[str, PromptState], prompt_ids: Sequence[str]) -> set[str]:
    """The prompts among `prompt_ids` whose tokens end with their prompt (ready ones: their length is known)."""
    return {p for p in prompt_ids if (s := states.get(p)) is not None and s.num_tokens == s.prompt_len}


def check_responses(
    states: Mapping[str, PromptState], prompt_ids: Sequence[str], sets: Mapping[str, Sequence[str]]
) -> None:
    """NothingToWalk when none of `prompt_ids` has a response, or none of those of a set in `sets`."""
    empty = without_response(states, prompt_ids)
    if not empty:
        return
    chosen = set(prompt_ids)
    if empty == chosen:
        raise NothingToWalk(
            f"none of the {len(chosen)} prompts has a response to walk (e.g. {sorted(empty)[:3]}): {REGISTER_INSTEAD}"
        )
    for name, ids in sets.items():
        mine = chosen.intersection(ids)
        if mine and mine <= empty:
            raise NothingToWalk(
                f"set {name!r}: none of its {len(mine)} prompts has a response to walk: {REGISTER_INSTEAD} "
                "(or leave the set out)"
            )


def rounds_warnings(results: Sequence[PromptEval], sets: Mapping[str, Sequence[str]]) -> list[str]:
    """The report's lines for prompts that had no round: how many of the run's and of each set's."""
    empty = [r.prompt_id for r in results if not r.chain.round_taus]
    if not empty:
        return []
    lines = [
        f"{len(results) - len(empty)} prompts evaluated, {len(empty)} without rounds (no response to walk, "
        f"e.g. {empty[:3]}; counted in no tau): {REGISTER_INSTEAD}"
    ]
    walked = {r.prompt_id for r in results}
    for name, ids in sets.items():
        mine = walked.intersection(ids)
        lacking = mine.intersection(empty)
        if lacking:
            lines.append(f"set {name!r}: {len(mine) - len(lacking)} prompts evaluated, {len(lacking)} without rounds")
    return lines
