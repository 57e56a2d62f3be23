"""Checkpoints evaluated against a cache server: each loaded strictly for the server's target, the
prompts chosen and waited for, then all evaluated in one pass (`evaluate_many`). Shared by
`eval-worker evaluate` (one checkpoint or a sweep) and the job worker."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from cache_server.client import CacheClient
from cache_server.torch_utils import TORCH_DTYPES, resolve_device
from eval_worker.checkpoints.loaded_checkpoint import Family, LoadedCheckpoint
from eval_worker.checkpoints.loading import detect, load_detected, request_of
from eval_worker.errors import CheckpointRefused
from eval_worker.evaluation.evaluate import evaluate_many
from eval_worker.evaluation.feature_cache import FeatureCache
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.progress import WalkProgress
from eval_worker.evaluation.responses import check_responses
from eval_worker.evaluation.source import FeatureSource
from eval_worker.settings import EvaluateSettings
from schemas.eval_spec import EvalSpec, FamilyOptions
from schemas.model import ModelInfo
from schemas.prompts import PromptState, PromptStatus
from schemas.report import EvalReport
from schemas.sampling import GREEDY, GREEDY_SETTING, trees_problem

log = logging.getLogger(__name__)


def set_members(client: CacheClient, sets: Sequence[str]) -> dict[str, list[str]]:
    """Each named set's prompt ids (UnknownSets from the server names a set that does not exist)."""
    return {name: [s.prompt_id for s in client.prompts(set_name=name)] for name in sets}


def select_prompts(
    client: CacheClient,
    prompt_ids: Sequence[str] | None,
    timeout_s: float,
    sets: Mapping[str, Sequence[str]] = {},
    *,
    progress: bool = False,
) -> list[str]:
    """The given ids, or every registered prompt (of `sets`, when given) that has not failed; waits until
    they are ready."""
    if prompt_ids is None:
        states = client.prompts()
        if sets:
            wanted = set().union(*map(set, sets.values()))
            states = [s for s in states if s.prompt_id in wanted]
        failed = [s.prompt_id for s in states if s.status == PromptStatus.failed]
        if failed:
            log.warning("skipping %d prompts the target failed on: %s", len(failed), failed[:5])
        prompt_ids = [s.prompt_id for s in states if s.status != PromptStatus.failed]
    if not prompt_ids:
        raise ValueError("no prompts to evaluate: register some with POST /prompts first")
    with tqdm(total=len(prompt_ids), desc="ready", unit="prompt", disable=not progress) as bar:
        client.wait_ready(prompt_ids, timeout_s=timeout_s, progress=lambda ready, _: bar.update(ready - bar.n))
    return list(prompt_ids)


def check_trees_greedy(states: Mapping[str, PromptState], prompt_ids: Sequence[Sequence[str]]) -> None:
    """ValueError (one line) when trees are asked of prompts whose responses are all sampled at T > 0."""
    settings = {p: (s.sampling or GREEDY).setting for p, s in states.items()}
    for ids in prompt_ids:
        problem = trees_problem(True, {settings.get(p, GREEDY_SETTING) for p in ids})
        if problem is not None:
            raise ValueError(problem)


def drafter_dtype(settings: EvaluateSettings, device: torch.device, info: ModelInfo) -> torch.dtype:
    """The asked dtype; by default fp32 on CPU (exact) and the served dtype on a GPU, as engines run it."""
    if settings.dtype is not None:
        return TORCH_DTYPES[settings.dtype]
    return TORCH_DTYPES[info.dtype] if device.type == "cuda" else torch.float32


def feature_cache(settings: EvaluateSettings) -> FeatureCache:
    """The resident-feature cache the settings ask for (host RAM, or the drafter's device)."""
    device = resolve_device(settings.device) if settings.feature_cache_on_device else torch.device("cpu")
    return FeatureCache(int(settings.feature_cache_gb * 2**30), device)


def load_checkpoints(
    info: ModelInfo,
    paths: Sequence[Path],
    spec: EvalSpec,
    blocks: Mapping[Family, FamilyOptions | None] | None = None,
) -> list[LoadedCheckpoint]:
    """Each checkpoint loaded strictly for target `info` as `spec` says (its config file, layer ids,
    inert keys, family block); with `blocks`, each with the block of its own family there instead (the
    command line fills one block per family from its flags). A refusal names the checkpoint."""
    config = Path(spec.config) if spec.config is not None else None
    loaded = []
    for path in paths:
        try:
            raw, family = detect(path, config)
            options = blocks.get(family.name) if blocks is not None else spec.family_options
            request = replace(request_of(spec), options=options)
            loaded.append(load_detected(path, raw, family, info, request))
        except CheckpointRefused as e:  # in a sweep, say which checkpoint
            raise CheckpointRefused(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    return loaded


def evaluate_checkpoints(  # noqa: PLR0913
    client: CacheClient,
    checkpoints: Sequence[Path | LoadedCheckpoint],
    settings: EvaluateSettings,
    spec: EvalSpec | None = None,
    *,
    prompt_ids: Sequence[Sequence[str] | None] | None = None,
    set_members_of: Sequence[Mapping[str, Sequence[str]]] | None = None,
    progress: bool = True,
    features: FeatureCache | None = None,
    source: FeatureSource | None = None,
    walk: WalkProgress | None = None,
) -> list[EvalReport]:
    """Load each checkpoint strictly for the server's target as `spec` says (a loaded one carries its
    options already) and evaluate them together, drafting as `spec.draft_sampling` says; checkpoint i on
    `prompt_ids[i]` (None: every registered prompt the target has not failed on, or of `spec.sets`),
    each report summarized per set too when the prompts come from sets (`set_members_of[i]`, as a job's
    claim carries them, or `spec.sets` looked up on the server).

    What each checkpoint drafts (trees, steps) is its own options'. Features and heads come from
    `source` when given (a view of the client's, as the doctor's readings are), else from the client.
    The walk counts into `walk` when given (a job's progress; WalkStopped once it stops a checkpoint)."""
    spec = spec or EvalSpec()
    info = client.model()
    paths = [c for c in checkpoints if not isinstance(c, LoadedCheckpoint)]
    fresh = iter(load_checkpoints(info, paths, spec))
    loaded = [c if isinstance(c, LoadedCheckpoint) else next(fresh) for c in checkpoints]
    wanted = prompt_ids if prompt_ids is not None else [None] * len(loaded)
    if set_members_of is None:
        members = set_members(client, spec.sets)
        set_members_of = [members] * len(loaded)
    ids = [
        select_prompts(client, p, settings.timeout_s, m, progress=progress)
        for p, m in zip(wanted, set_members_of, strict=True)
    ]
    states = {s.prompt_id: s for s in client.prompts()}  # ready now: their lengths and settings are known
    for i, m in zip(ids, set_members_of, strict=True):
        check_responses(states, i, m)
    check_trees_greedy(states, [i for c, i in zip(loaded, ids, strict=True) if c.options.asks_trees])
    device = resolve_device(settings.device)
    options = EvalOptions(
        device=str(device),
        dtype=drafter_dtype(settings, device, info),
        progress=progress,
        draft_sampling=spec.draft_sampling,
    )
    heads = HeadsCache(settings.heads_cache)
    return evaluate_many(
        source or client,
        loaded,
        ids,
        heads_cache=heads,
        options=options,
        features=features,
        set_members=set_members_of,
        progress=walk,
    )
