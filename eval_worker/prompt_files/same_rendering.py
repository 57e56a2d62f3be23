"""One rendering of each row per set: rows added to a set that already holds them (the same `file:row`
names) must be rendered as they were (the thinking flag, the chat template, the prompt's tokens: the same
--suffix and --field), so that responses sampled anew are the same prompts sampled rather than other
prompts mixed into the set. Checked before anything is registered (prompts cannot be unregistered)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from schemas.prompts import PromptState

if TYPE_CHECKING:  # `prompts add --help` loads no client
    from cache_server.client import CacheClient

_FIX = (
    "register them with the rendering options of their first registration (--enable-thinking / "
    "--disable-thinking, --suffix, --field, --no-chat-template) to sample the same prompts, or in a set of "
    "their own (--set NAME)"
)


def _thinking(flag: bool | None) -> str:
    return {True: "--enable-thinking", False: "--disable-thinking", None: "the template's default"}[flag]


def check_same_rendering(
    client: CacheClient, set_name: str, specs: Sequence[dict[str, Any]], enable_thinking: bool | None
) -> None:
    """ValueError naming what differs when `set_name` already holds some of `specs`' rows rendered otherwise."""
    if set_name not in {s.name for s in client.sets().sets}:
        return
    held: dict[str, PromptState] = {}
    for state in client.prompts(set_name=set_name):
        if state.name is not None:
            held.setdefault(state.name, state)
    again = [spec for spec in specs if spec["name"] in held]
    differ = _differences(client, [held[spec["name"]] for spec in again], again, enable_thinking) if again else []
    if differ:
        names = ", ".join(spec["name"] for spec in again[:3])
        raise ValueError(
            f"set {set_name!r} already holds {len(again)} of these rows ({names}) rendered otherwise: "
            f"{'; '.join(differ)}: {_FIX}"
        )


def _differences(
    client: CacheClient, before: list[PromptState], again: list[dict[str, Any]], enable_thinking: bool | None
) -> list[str]:
    """What renders the rows `again` otherwise than their prompts `before`: thinking, template, tokens."""
    differ = []
    thinking = {s.enable_thinking for s in before}
    if thinking != {enable_thinking}:
        differ.append(f"thinking {' / '.join(sorted(map(_thinking, thinking)))}, now {_thinking(enable_thinking)}")
    template = "messages" in again[0]  # every spec of a run is rendered alike
    if any((s.chat_template_sha256 is not None) != template for s in before):
        differ.append("the chat template " + ("off, now on" if template else "on, now off"))
    # The prompts alone, tokenized as registering them would; a row registered before as a prompt alone
    # (a finished chat) is not counted by the plan, and then there is no sum to compare.
    plan = client.plan(again, generate=None)
    tokens = sum(s.prompt_len for s in before)
    if plan.prompts == len(again) and plan.tokens != tokens:
        differ.append(f"{tokens} prompt tokens, now {plan.tokens} (another --suffix or --field)")
    return differ
