"""One prompt's live speculative decoding against its offline chain rounds.

Both walk the stored response from its first token (the prefill's): a round drafts K tokens after the
position reached and accepts its longest matching prefix, plus the target's own next token. They must
agree exactly, but in a prompt's last round the engine counts drafts accepted past `max_tokens` (it
counts before its stop check cuts the output), where the offline walk compares only the reference
tokens left: that, and nothing else, is allowed."""

from __future__ import annotations

from collections.abc import Sequence

from eval_worker.parity.engine import SpecCounters
from schemas.parity import PromptParity


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_prompt(
    prompt_id: str,
    stored_response: Sequence[int],
    engine_response: Sequence[int],
    offline_taus: Sequence[int],
    live: SpecCounters,
    speculative_tokens: int,
) -> PromptParity:
    """The verdict for one prompt; `offline_taus` are its chain rounds (accepted + 1 each)."""
    rounds, accepted = len(offline_taus), sum(offline_taus) - len(offline_taus)
    differs = first_difference(stored_response, engine_response)
    # The walk reaches position prompt_len + sum(taus): past the response's last token only when its last
    # round accepted every token left (a miss there stops at the last token, with the target's own).
    reached_end = sum(offline_taus) == len(stored_response)
    surplus = live.accepted - accepted
    if differs is not None:
        agrees, why = False, f"the engine's greedy tokens differ from the stored response at position {differs}"
    elif live.drafts != rounds:
        agrees, why = False, f"{live.drafts} live draft rounds against {rounds} offline"
    elif surplus == 0:
        agrees, why = True, "identical"
    elif reached_end and 0 < surplus <= speculative_tokens:
        drafts = "draft" if surplus == 1 else "drafts"
        agrees, why = True, f"identical but the last round: the engine counted {surplus} {drafts} past max_tokens"
    else:
        agrees, why = False, f"{live.accepted} live accepted tokens against {accepted} offline in {rounds} rounds"
    return PromptParity(
        prompt_id=prompt_id,
        response_tokens=len(stored_response),
        first_token_difference=differs,
        live_drafts=live.drafts,
        live_accepted=live.accepted,
        offline_rounds=rounds,
        offline_accepted=accepted,
        agrees=agrees,
        why=why,
    )


def tau(drafts: int, accepted: int) -> float | None:
    """vLLM's averaging: 1 + accepted / drafts over all rounds (None without a round)."""
    return 1 + accepted / drafts if drafts else None
