"""A prompt spec as registrations: a multi-turn chat's earlier answers filled in (`response_of`), the
prompt encoded by the target's tokenizer and checked against its context, the tokens a drafter trains on,
one registration per response (the given one, or each sample a generation setting asks for)."""

from __future__ import annotations

from cache_server.capture.tokenizer import PromptTokenizer
from cache_server.compute.registry import Registration, Registry, prompt_id_for
from cache_server.errors import InvalidPrompt
from cache_server.store.hidden_store import HiddenStore
from schemas.loss_mask import Spans, joined, spans_of
from schemas.prompts import ChatMessage, GenerateSpec, PromptSpec


def registrations_for(spec: PromptSpec, generate: GenerateSpec | None, prompts: PromptTokenizer) -> list[Registration]:
    """One registration per response of a spec whose answers are filled in: the given one, or each
    sample `generate` asks for; InvalidPrompt for what the tokenizer or the context refuses."""
    prompt_ids = tuple(prompts.encode(spec))
    response = tuple(spec.response_token_ids) if spec.response_token_ids is not None else None
    max_new = generate.max_new_tokens if generate is not None and response is None else None
    prompts.check_length(len(prompt_ids) + (len(response) if response else max_new or 0))
    samplings = [spec.sampling if spec.sampling is not None and not spec.sampling.greedy else None]  # given
    if response is None and generate is not None:
        samplings = [generate.sample_params(i) for i in range(generate.samples)]
    loss_spans = _loss_spans(spec, prompt_ids, response, max_new is not None, prompts)
    return [
        Registration(
            prompt_id=prompt_id_for(prompt_ids, response, max_new, sampling, loss_spans),
            prompt_ids=prompt_ids,
            response_ids=response,
            max_new_tokens=max_new,
            name=spec.name,
            chat_template_sha256=prompts.chat_template_sha256 if spec.messages is not None else None,
            enable_thinking=spec.enable_thinking,
            sampling=sampling,
            generator=spec.generator if response is not None else None,
            loss_spans=loss_spans,
        )
        for sampling in samplings
    ]


def _loss_spans(
    spec: PromptSpec,
    prompt_ids: tuple[int, ...],
    response: tuple[int, ...] | None,
    generates: bool,
    prompts: PromptTokenizer,
) -> Spans | None:
    """The ranges `spec` trains on over its prompt and given response (a generated response is trained
    on whole, beyond them), or None for the default, the response alone."""
    if isinstance(spec.loss_mask, list):
        total = len(prompt_ids) + len(response or ())
        if generates:
            raise InvalidPrompt("a loss_mask of 0/1 per token needs every token known: it cannot go with generate")
        if len(spec.loss_mask) != total:
            raise InvalidPrompt(f"loss_mask has {len(spec.loss_mask)} entries for {total} tokens (prompt and response)")
        spans = spans_of(spec.loss_mask)
    elif spec.messages is not None:
        finished = spec.messages[-1].role == "assistant"
        if finished and generates:
            raise InvalidPrompt("a chat that ends with an assistant turn is finished: it cannot go with generate")
        # A chat awaiting its answer trains on the answer alone by default: speculators' row of that turn,
        # its earlier turns context (and its id what it was before loss masks).
        mode = spec.loss_mask or ("assistant_turns" if finished else "last_turn")
        if mode == "last_turn":
            turns = prompts.assistant_turns(spec, prompt_ids, last_only=True) if finished else ()
        else:
            turns = prompts.assistant_turns(spec, prompt_ids)
        given = ((len(prompt_ids), len(prompt_ids) + len(response)),) if response else ()
        spans = joined(turns, given)
    else:
        return None
    default = () if response is None else ((len(prompt_ids), len(prompt_ids) + len(response)),)
    return None if spans == default else spans


def fill_in_answers(spec: PromptSpec, registry: Registry, store: HiddenStore, prompts: PromptTokenizer) -> PromptSpec:
    """`spec` with every `response_of` message replaced by that prompt's response, decoded."""
    if not spec.messages or all(m.response_of is None for m in spec.messages):
        return spec
    messages = []
    for m in spec.messages:
        if m.response_of is not None:
            reg, manifest = registry.get(m.response_of), store.manifest(m.response_of, fresh=True)
            if reg is None:
                raise InvalidPrompt(f"response_of {m.response_of!r}: no such prompt is registered")
            if manifest is None:
                raise InvalidPrompt(
                    f"response_of {m.response_of!r}: that prompt's response is not computed yet "
                    "(wait until it is ready, then register the next turn)"
                )
            response = store.token_ids(m.response_of)[reg.prompt_len :].tolist()
            m = ChatMessage(role="assistant", content=prompts.decode(response))
        messages.append(m)
    return spec.model_copy(update={"messages": messages})
