"""Config keys every drafter family shares, and the check that no other key is ignored.

A loader honours each key it reads, lists the ones that do not change a drafter's math here or beside
its layout, and refuses any other key by name unless the user named it inert (`--inert-config-keys`):
a key that may change the math is never ignored silently, and naming a key the loader knows never
switches it off."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from eval_worker.errors import CheckpointRefused

# HF fields that do not change a drafter's math at evaluation (bookkeeping, training, generation).
INERT = {
    "architectures", "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "use_cache", "initializer_range", "max_position_embeddings", "attention_dropout",
    "max_window_layers", "_name_or_path", "name_or_path", "_attn_implementation", "_attn_implementation_autoset",
    "output_attentions", "output_hidden_states", "return_dict", "embed_requires_grad",
    "auto_map",  # names remote code; nothing here runs it
}  # fmt: skip
INERT_FLAG = "--inert-config-keys"


@dataclass(frozen=True)
class KeysAccepted:
    """What the key checks of one config (all its blocks) accepted beyond the loader's own keys."""

    inert: tuple[str, ...] = ()  # present, unknown to the loader, accepted because the request named them
    still_read: tuple[str, ...] = ()  # present, named inert, but the loader's own: honoured as always

    def __or__(self, other: KeysAccepted) -> KeysAccepted:
        """Both blocks' keys, sorted, each once (a config's nested blocks take the same set)."""
        return KeysAccepted(
            tuple(sorted({*self.inert, *other.inert})), tuple(sorted({*self.still_read, *other.still_read}))
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a report should say of the request's inert keys (a named key the loader knows)."""
        if not self.still_read:
            return ()
        return (
            f"{INERT_FLAG} names {list(self.still_read)}, which this loader knows: they are read as always "
            "(naming a key inert accepts only keys the loader does not know)",
        )


def check_keys(raw: Mapping[str, Any], known: Set[str], where: str, inert: Set[str] = frozenset()) -> KeysAccepted:
    """The keys of `raw` outside `known` that `inert` names (accepted); CheckpointRefused naming the others.

    A key in `known` that `inert` names is still the loader's (recorded in `still_read`, never skipped);
    a key `inert` names that `raw` lacks is nothing to record. `INERT`, known inert to every loader, is
    never worth a warning."""
    unknown = set(raw) - known
    refused = sorted(unknown - inert)
    if refused:
        accept = ",".join(sorted({*refused, *inert}))
        raise CheckpointRefused(
            f"{where} config keys {refused} are not known to this loader; a key that may change the drafter's "
            f"math is never ignored: if they do not, accept them with {INERT_FLAG} {accept} "
            "(inert_config_keys in a job)"
        )
    return KeysAccepted(tuple(sorted(unknown)), tuple(sorted((set(raw) & inert & known) - INERT)))


def inert_lines(accepted: KeysAccepted) -> list[str]:
    """What `eval-worker inspect` says of the keys accepted as inert, when there are any to mention."""
    lines = [f"inert keys         {list(accepted.inert)} (accepted as named)"] if accepted.inert else []
    return lines + [f"warning            {w}" for w in accepted.warnings]
