"""The free-space check before a registration: the new prompts' capture layers, and what the captures
queued or running on any server of the store will still write, must fit a local store's free space."""

from __future__ import annotations

import math

from cache_server.compute.registry import Registration, Registry
from cache_server.coordination.captures import CaptureQueue
from cache_server.errors import StorageExceeded
from schemas.plan import StoragePlan


def most_tokens(reg: Registration) -> int:
    """The most tokens a registration stores: its prompt and its response (given, or generated up to
    `max_new_tokens`)."""
    return reg.prompt_len + len(reg.response_ids or ()) + (reg.max_new_tokens or 0)


def unwritten(plan: StoragePlan, captures: CaptureQueue, registry: Registry) -> tuple[int, int]:
    """(prompts, bytes) the queued and running captures will still write: per prompt its most tokens x
    its layers x the plan's bytes per token per layer, over the plan's codec ratio. A running capture
    counts whole (what it wrote already is counted twice: the check errs towards refusing)."""
    layer_tokens = prompts = 0
    for prompt_id, layers in captures.unwritten().items():
        reg = registry.get(prompt_id)
        if reg is not None and layers:
            layer_tokens += most_tokens(reg) * len(layers)
            prompts += 1
    return prompts, math.ceil(layer_tokens * plan.bytes_per_token_per_layer / plan.codec_ratio)


def check_room(plan: StoragePlan, captures: CaptureQueue, registry: Registry) -> None:
    """StorageExceeded, before anything is written, if the new prompts' capture layers (`plan`) and what
    registered prompts not captured yet will write do not fit a local store's free space."""
    if plan.free_bytes is None:
        return
    pending, pending_bytes = unwritten(plan, captures, registry)
    if plan.capture_layers_bytes + pending_bytes > plan.free_bytes:
        raise StorageExceeded(
            f"{plan.prompts} new prompts of up to {plan.tokens} tokens would store about "
            f"{plan.capture_layers_bytes} bytes ({len(plan.capture_layers)} layers x "
            f"{plan.bytes_per_token_per_layer} bytes per token, codec ratio {plan.codec_ratio:.2f}), and "
            f"{pending} prompts registered but not captured yet about {pending_bytes} more; the store has "
            f"{plan.free_bytes} bytes free"
        )
