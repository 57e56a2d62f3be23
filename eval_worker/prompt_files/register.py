"""`eval-worker prompts add`: register the prompts of dataset files as one set, rendered as the target's
chat template would (with thinking on or off) or as plain text, and watch them become ready; or, with
`whole_chats`, register chat rows as whole, finished conversations (training data: nothing generated)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eval_worker.prompt_files.records import BadRow, Row, prompt_of, read_rows, whole_chat_of
from eval_worker.prompt_files.same_rendering import check_same_rendering
from schemas.plan import StoragePlan
from schemas.prompts import GenerateSpec, PromptStatus, SetCounts

if TYPE_CHECKING:  # `eval-worker prompts add --help` reads this module's defaults: it loads no client
    from cache_server.client import CacheClient

log = logging.getLogger(__name__)
BATCH = 10000  # prompts per POST /prompts (the server's limit; each request is all or nothing)
DEFAULT_MAX_NEW_TOKENS = 2048  # --max-new-tokens
LossMaskName = Literal["assistant_turns", "last_turn"]


@dataclass(frozen=True)
class AddOptions:
    """How rows become prompts."""

    set_name: str
    generate: GenerateSpec  # how responses are generated: greedy, or sampled, `samples` per prompt
    field: str | None = None
    chat_template: bool | None = None  # None: on when the target's tokenizer has one
    enable_thinking: bool | None = None  # None: the template's default
    limit: int | None = None
    shuffle_seed: int | None = None
    suffix: str = ""
    skip_bad: bool = False
    timeout_s: float = 600.0  # waiting for a multi-turn prompt's earlier turns
    whole_chats: bool = False  # chat rows as whole, finished conversations; `generate` is not used
    loss_mask: LossMaskName | None = None  # with whole_chats: the turns trained on (None: assistant_turns)

    def __post_init__(self) -> None:
        """ValueError for options that make no sense together (with --whole-chats, or without it)."""
        if not self.whole_chats:
            if self.loss_mask is not None:
                raise ValueError("--loss-mask picks a whole chat's turns to train on: it needs --whole-chats")
            return
        if self.suffix:
            raise ValueError("--suffix with --whole-chats: a whole chat is registered as it is, nothing appended")
        if self.chat_template is False:
            raise ValueError("--no-chat-template with --whole-chats: a chat is rendered by the chat template")
        if self.generate != GenerateSpec(max_new_tokens=DEFAULT_MAX_NEW_TOKENS):
            raise ValueError(
                "--whole-chats registers finished chats and generates nothing: drop --max-new-tokens, "
                "--temperature, --top-p, --top-k, --min-p, --seed and --samples"
            )

    def generation(self) -> GenerateSpec | None:
        """The `generate` of every `POST /prompts` (and `/plan`): None for whole chats, which the server
        refuses to answer."""
        return None if self.whole_chats else self.generate


@dataclass(frozen=True)
class Added:
    """What a run registered (its rows, and their prompts: every sample and later turn), and the rows it
    skipped (with --skip-bad)."""

    rows: int
    prompt_ids: list[str]
    skipped: list[str]

    def line(self, set_name: str, samples: int) -> str:
        """`6 rows registered in set 'gsm8k' as 24 prompts (4 samples each)`, and the rows skipped."""
        later = len(self.prompt_ids) - self.rows * samples
        details = [f"{samples} samples each"] * (samples > 1) + [f"{later} later turns"] * (later > 0)
        return (
            f"{self.rows} rows registered in set {set_name!r} as {len(self.prompt_ids)} prompts"
            + (f" ({', '.join(details)})" if details else "")
            + (f"; {len(self.skipped)} bad rows skipped" if self.skipped else "")
        )


def collect_rows(files: Sequence[Path], opts: AddOptions) -> tuple[list[Row], list[str]]:
    """Every file's prompts (shuffled and limited as asked), and the bad rows' messages; BadRow at the
    first bad row unless `skip_bad`."""
    rows, skipped = [], []
    for path in files:
        for i, record in enumerate(read_rows(path)):
            try:
                read = whole_chat_of if opts.whole_chats else prompt_of
                rows.append(read(record, path, i, opts.field))
            except BadRow as e:
                if not opts.skip_bad:
                    raise BadRow(f"{e} (--skip-bad skips such rows, listing them)") from None
                skipped.append(str(e))
    if opts.shuffle_seed is not None:
        random.Random(opts.shuffle_seed).shuffle(rows)
    return rows[: opts.limit] if opts.limit is not None else rows, skipped


def prompt_spec(row: Row, opts: AddOptions, chat_template: bool) -> dict[str, Any]:
    """The `POST /prompts` entry of a row."""
    spec: dict[str, Any] = {"name": f"{row.file.name}:{row.index}", "sets": [opts.set_name]}
    if opts.whole_chats:  # a finished chat: the server renders it without a generation prompt
        spec["loss_mask"] = opts.loss_mask or "assistant_turns"
    messages = row.messages or [{"role": "user", "content": (row.text or "") + opts.suffix}]
    if row.messages is not None and opts.suffix:
        messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + opts.suffix}]
    if chat_template:
        spec["messages"] = messages
        if opts.enable_thinking is not None:
            spec["enable_thinking"] = opts.enable_thinking
    elif row.messages is not None or row.later_turns:
        raise BadRow(
            f"{row.file} row {row.index}: a chat or a multi-turn prompt needs the chat template "
            "(drop --no-chat-template)"
        )
    else:
        spec["text"] = messages[0]["content"]
    return spec


def later_turn_spec(row: Row, opts: AddOptions, earlier: list[str], turn: int) -> dict[str, Any]:
    """Turn `turn` (1-based, >= 2) of a multi-turn row: every earlier user turn followed by the target's own
    answer to it (the server fills in the response of each earlier turn's prompt), then this turn."""
    users = [row.text or "", *row.later_turns][:turn]
    messages: list[dict[str, Any]] = []
    for text, answered in zip(users, [*earlier, None], strict=True):
        messages.append({"role": "user", "content": text + opts.suffix})
        if answered is not None:
            messages.append({"role": "assistant", "response_of": answered})
    spec: dict[str, Any] = {
        "name": f"{row.file.name}:{row.index}:turn{turn}",
        "sets": [opts.set_name],
        "messages": messages,
    }
    if opts.enable_thinking is not None:
        spec["enable_thinking"] = opts.enable_thinking
    return spec


def _first_turns(
    client: CacheClient, files: Sequence[Path], opts: AddOptions
) -> tuple[list[Row], list[Any], list[str]]:
    """Every row (nothing goes on if one is bad, unless `skip_bad`), its first turn's `POST /prompts` entry,
    and the bad rows' messages."""
    has_template = client.model().chat_template_sha256 is not None
    use_template = has_template if opts.chat_template is None else opts.chat_template
    if use_template and not has_template:
        raise ValueError("--chat-template: the target's tokenizer has no chat template")
    if opts.whole_chats and not use_template:
        raise ValueError("--whole-chats: the target's tokenizer has no chat template to render a chat with")
    if opts.enable_thinking is not None and not use_template:
        raise ValueError("--enable-thinking / --disable-thinking are passed to the chat template, which is off")
    rows, skipped = collect_rows(files, opts)
    specs = [prompt_spec(row, opts, use_template) for row in rows]
    if not specs:
        raise ValueError(f"no prompts in {[str(f) for f in files]}")
    check_same_rendering(client, opts.set_name, specs, opts.enable_thinking)
    if opts.generate.samples > 1 and any(row.later_turns for row in rows):
        raise ValueError("--samples > 1 with multi-turn rows: each later turn follows one answer; register one sample")
    return rows, specs, skipped


def plan_prompts(client: CacheClient, files: Sequence[Path], opts: AddOptions) -> tuple[StoragePlan, int]:
    """`--dry-run`: what registering the files' first turns would store, nothing registered; and how many
    later turns of multi-turn rows it leaves out (they are tokenized only once the earlier turns are answered)."""
    rows, specs, _ = _first_turns(client, files, opts)
    plans = [client.plan(specs[lo : lo + BATCH], generate=opts.generation()) for lo in range(0, len(specs), BATCH)]
    total = plans[0].for_load(sum(p.prompts for p in plans), sum(p.tokens for p in plans))
    return total, sum(len(row.later_turns) for row in rows)


def add_prompts(client: CacheClient, files: Sequence[Path], opts: AddOptions) -> Added:
    """Read every row first (nothing is registered if one is bad, unless `skip_bad`), then register."""
    rows, specs, skipped = _first_turns(client, files, opts)
    ids = _register(client, specs, opts.generation())
    # Multi-turn rows: turn k is registered once the target has answered turns 1..k-1 (each its own prompt).
    firsts = ids[:: opts.generate.samples]  # each row's samples are in turn (multi-turn rows have one)
    threads = {i: [pid] for i, (row, pid) in enumerate(zip(rows, firsts, strict=True)) if row.later_turns}
    for turn in range(2, 2 + max((len(rows[i].later_turns) for i in threads), default=0)):
        waiting = {i: chain for i, chain in threads.items() if len(rows[i].later_turns) >= turn - 1}
        client.wait_ready([chain[-1] for chain in waiting.values()], timeout_s=opts.timeout_s)
        later = [later_turn_spec(rows[i], opts, chain, turn) for i, chain in waiting.items()]
        for chain, prompt_id in zip(waiting.values(), _register(client, later, opts.generate), strict=True):
            chain.append(prompt_id)
            ids.append(prompt_id)
    return Added(len(rows), ids, skipped)


def _register(client: CacheClient, specs: list[dict[str, Any]], generate: GenerateSpec | None) -> list[str]:
    ids: list[str] = []
    for lo in range(0, len(specs), BATCH):
        ids += [p.prompt_id for p in client.register(specs[lo : lo + BATCH], generate=generate)]
    return ids


def _pending_line(counts: SetCounts) -> str:
    """`4 generating, 1 capturing, 1 queued, 2 failed`: the counts that are not 0."""
    parts = [("generating", counts.generating), ("capturing", counts.capturing), ("queued", counts.queued)]
    return ", ".join(f"{n} {what}" for what, n in [*parts, ("failed", counts.failed)] if n)


def wait_with_progress(client: CacheClient, set_name: str, timeout_s: float, poll_s: float = 1.0) -> None:
    """A tqdm bar of the set's ready prompts, with the pending ones beside it by where they are (queued,
    their responses being generated, being captured) and the failed ones, from the server's counts (one
    `GET /sets` per poll); TimeoutError past `timeout_s`."""
    from tqdm import tqdm

    deadline = time.monotonic() + timeout_s
    with tqdm(desc=set_name, unit="prompt") as bar:
        while True:
            counts = next(s for s in client.sets().sets if s.name == set_name)
            bar.total = counts.total
            bar.update(counts.ready - bar.n)
            bar.set_postfix_str(_pending_line(counts))
            if counts.pending == 0:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{counts.pending} prompts of {set_name!r} still pending after {timeout_s:.0f} s")
            time.sleep(poll_s)
    if counts.failed:
        failed = [p.prompt_id for p in client.prompts(PromptStatus.failed, set_name=set_name)]
        log.warning("%d prompts of %r failed (e.g. %s)", counts.failed, set_name, failed[:3])
