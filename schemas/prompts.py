"""Prompt registration and status: the bodies of `POST /prompts` and `GET /prompts[/{id}]`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

from schemas.dtypes import DTypeName
from schemas.sampling import MAX_SAMPLES, SamplingParams

# Hard ceiling on generated tokens per prompt; the server also caps by the model's context.
MAX_NEW_TOKENS_LIMIT = 32768


def _valid_unicode(text: str) -> str:
    """Refuse what JSON can carry but no tokenizer can read: lone surrogates (e.g. "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode (position {e.start}: {e.reason})") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]
# A prompt set's name (gsm8k, mt-bench, ...): safe in a URL path and as a file name.
SetName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
MAX_SETS_PER_PROMPT = 16


class GeneratorInfo(BaseModel):
    """How a prompt's response was made: by the target in-process (`hf`), by a serving engine over its
    OpenAI-compatible API (`engine`: its URL, served model and version), or `given` with the prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["hf", "engine", "given"]
    url: str | None = None
    model: str | None = None
    version: str | None = None

    def describe(self) -> str:
        """One line: `hf`, `given`, or `engine <url> <model> <version>`."""
        if self.kind != "engine":
            return self.kind
        return f"engine {self.url} {self.model} {self.version or 'version unknown'}"


class CaptureInfo(BaseModel):
    """How a prompt's hidden states were computed: by the cache server's transformers forward (`hf`), or
    by the serving engine's own forward (`engine`: its version, dtype and tensor/pipeline parallel
    sizes). Part of the store namespace's fingerprint, so the two never mix."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["hf", "engine"]
    dtype: DTypeName
    version: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def describe(self) -> str:
        """One line: `hf float32`, or `engine vllm 0.32.0 bfloat16 tp 8 pp 1`."""
        if self.kind == "hf":
            return f"hf {self.dtype}"
        sizes = f"tp {self.tensor_parallel_size} pp {self.pipeline_parallel_size}"
        return f"engine vllm {self.version or 'version unknown'} {self.dtype} {sizes}"

    def fingerprint_part(self) -> str:
        """What it adds to the namespace fingerprint: nothing for `hf` (namespaces keep the id they had
        before engine captures), else the engine's kind, version and parallel sizes (the dtype is hashed
        on its own)."""
        if self.kind == "hf":
            return ""
        return f"capture=engine;version={self.version};tp={self.tensor_parallel_size};pp={self.pipeline_parallel_size};"


class ChatMessage(BaseModel):
    """One chat turn, rendered with the target's chat template. An assistant turn may instead name a
    registered prompt (`response_of`) whose response the server fills in, decoded as text: a later turn
    of a multi-turn conversation then carries the target's own earlier answer (the DFlash benchmark's
    mt-bench protocol)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: Text | None = None
    response_of: str | None = Field(default=None, min_length=1, max_length=64)

    @model_validator(mode="after")
    def _content_or_response(self) -> ChatMessage:
        if (self.content is None) == (self.response_of is None):
            raise ValueError("a message needs exactly one of content and response_of")
        if self.response_of is not None and self.role != "assistant":
            raise ValueError("response_of fills in an assistant turn")
        return self


class PromptSpec(BaseModel):
    """Exactly one of `text`, `messages` (chat template applied) or `token_ids` (plain JSON integers)."""

    model_config = ConfigDict(extra="forbid")
    text: Text | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    token_ids: list[StrictInt] | None = Field(default=None, min_length=1)
    response_token_ids: list[StrictInt] | None = Field(default=None, min_length=1)
    name: str | None = Field(default=None, max_length=256)
    sets: list[SetName] = Field(
        default_factory=list, max_length=MAX_SETS_PER_PROMPT, description="prompt sets this prompt belongs to"
    )
    enable_thinking: bool | None = Field(
        default=None, description="passed to the chat template (messages only); None: the template's default"
    )
    sampling: SamplingParams | None = Field(
        default=None,
        description="with response_token_ids: how that response was sampled from the target (None: greedy); "
        "its tokens are then checked against that setting's support, not the argmax",
    )
    generator: GeneratorInfo | None = Field(
        default=None,
        description='with response_token_ids: what made that response, e.g. {"kind": "engine", "url", "model", '
        '"version"} for a serving engine\'s output path (None: "given")',
    )
    loss_mask: list[Annotated[StrictInt, Field(ge=0, le=1)]] | Literal["assistant_turns", "last_turn"] | None = Field(
        default=None,
        description="which tokens a drafter trains on: 0/1 per token of prompt and given response; "
        '"assistant_turns": every assistant turn and the response; '
        '"last_turn": the response, or the last assistant turn of a finished chat; '
        "None: assistant_turns for a finished chat (ending with the assistant's turn), else the response",
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> PromptSpec:
        given = [k for k in ("text", "messages", "token_ids") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a prompt needs exactly one of text, messages, token_ids (got {given or 'none'})")
        if self.text is not None and not self.text:
            raise ValueError("text must not be empty")
        if self.enable_thinking is not None and self.messages is None:
            raise ValueError("enable_thinking is passed to the chat template: it needs messages")
        if len(set(self.sets)) != len(self.sets):
            raise ValueError(f"sets must be distinct, got {self.sets}")
        if isinstance(self.loss_mask, str) and self.messages is None:
            raise ValueError(f"loss_mask {self.loss_mask!r} reads a chat's turns: it needs messages")
        if self.messages is not None and self.messages[-1].role == "assistant" and self.response_token_ids is not None:
            raise ValueError("a chat that ends with an assistant turn is finished: it takes no response_token_ids")
        if (self.sampling is not None or self.generator is not None) and self.response_token_ids is None:
            raise ValueError(
                "sampling and generator declare how a given response was made: they need response_token_ids"
            )
        return self


class GenerateSpec(BaseModel):
    """Generate each response with the target up to `max_new_tokens`: greedily (temperature 0, the
    default), or `samples` responses sampled at the given setting, sample i with seed `seed + i`; each
    sample is a prompt of its own, its id derived from the setting and its seed."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int = Field(ge=1, le=MAX_NEW_TOKENS_LIMIT)
    temperature: float = Field(default=0.0, ge=0, le=100, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: StrictInt = Field(default=0, ge=0, description="0: off")
    min_p: float = Field(default=0.0, ge=0, le=1)
    seed: StrictInt = Field(default=0, ge=0, lt=2**62, description="sample i is drawn with seed + i")
    samples: StrictInt = Field(default=1, ge=1, le=MAX_SAMPLES, description="responses per prompt")

    @model_validator(mode="after")
    def _samples_need_temperature(self) -> GenerateSpec:
        self.sample_params(0)  # the filters' own checks (finite numbers)
        if self.temperature == 0 and self.samples > 1:
            raise ValueError("samples > 1 needs temperature > 0: greedy responses are all the same")
        return self

    def sample_params(self, index: int) -> SamplingParams | None:
        """How sample `index` is drawn; None when greedy."""
        if self.temperature == 0:
            return None
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed + index,
        )


class RegisterRequest(BaseModel):
    """`POST /prompts`."""

    model_config = ConfigDict(extra="forbid")
    prompts: list[PromptSpec] = Field(min_length=1, max_length=10000)
    generate: GenerateSpec | None = None


class PromptStatus(StrEnum):
    """Where a prompt's computation is."""

    pending = "pending"
    ready = "ready"
    failed = "failed"


class RegisteredPrompt(BaseModel):
    """A registered prompt's id and status."""

    prompt_id: str
    status: PromptStatus


class RegisterResponse(BaseModel):
    """The answer of `POST /prompts`, one entry per response in request order (each sample of a prompt
    in turn)."""

    prompts: list[RegisteredPrompt]


class PromptState(BaseModel):
    """`GET /prompts/{id}`: status, tokens and what is stored."""

    prompt_id: str
    name: str | None = None
    status: PromptStatus
    prompt_len: int
    num_tokens: int | None = None  # known once the response exists (given or generated)
    token_ids: list[int] | None = None
    layers_stored: list[int] = Field(default_factory=list)
    sets: list[str] = Field(default_factory=list)
    chat_template_sha256: str | None = Field(
        default=None, description="sha256 of the chat template text that rendered the prompt; None: no template"
    )
    enable_thinking: bool | None = Field(default=None, description="what the chat template was given")
    greedy_mismatches: int | None = Field(
        default=None, description="response tokens that are not the target's greedy choice (0: its own greedy)"
    )
    generator: GeneratorInfo | None = Field(default=None, description="how the response was made, once it is stored")
    sampling: SamplingParams | None = Field(
        default=None, description="how the response was sampled from the target (None: greedy)"
    )
    outside_support: int | None = Field(
        default=None,
        description="sampled responses: tokens the target gives zero probability under the declared "
        "top-k/top-p/min-p at the capture forward (0: all in its support)",
    )
    loss_spans: list[tuple[int, int]] | None = Field(
        default=None,
        description="the [start, stop) token ranges a drafter trains on (a response still to be generated is "
        "trained on too); None: the response tokens",
    )
    error: str | None = None


class PromptPage(BaseModel):
    """One page of `GET /prompts`."""

    prompts: list[PromptState]
    total: int
    offset: int
    limit: int


class SetCounts(BaseModel):
    """One prompt set and how many of its prompts are in each status; the pending ones split as
    `queued + generating + capturing`."""

    name: str
    total: int
    pending: int
    ready: int
    failed: int
    queued: int = Field(default=0, description="pending prompts no server has taken up yet")
    generating: int = Field(
        default=0,
        description="pending prompts a server has taken up whose responses it is making (generated, then captured)",
    )
    capturing: int = Field(default=0, description="pending prompts a server is capturing, their tokens known")
    greedy_mismatches: int = Field(
        default=0, description="response tokens of its ready prompts that are not the target's greedy choice"
    )
    prompts_not_greedy: int = Field(default=0, description="ready prompts with at least one such token")
    outside_support: int = Field(
        default=0, description="response tokens of its ready sampled prompts outside the target's support"
    )
    prompts_outside_support: int = Field(default=0, description="ready sampled prompts with at least one such token")
    settings: dict[str, int] = Field(
        default_factory=dict, description='prompts per sampling setting of their responses ("T=0", "T=0.6 ...")'
    )


class SetList(BaseModel):
    """`GET /sets`."""

    sets: list[SetCounts]
    no_set: SetCounts | None = Field(
        default=None, description='the registered prompts that belong to no set, counted alike (name "")'
    )
    all_prompts: SetCounts | None = Field(default=None, description='every registered prompt, counted alike (name "")')
