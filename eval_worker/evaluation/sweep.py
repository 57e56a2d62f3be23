"""Checkpoints evaluated against a cache server: each loaded strictly for the server's target, the
prompts chosen and waited for, then all evaluated in one pass (`evaluate_many`). Shared by
`eval-worker evaluate` (one checkpoint or a sweep) and the job worker."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from cache_server.client import CacheClient
from cache_server.torch_utils import TORCH_DTYPES, resolve_device
from eval_worker.checkpoints.layer_ids import LayerConvention
from eval_worker.checkpoints.loaded import LoadedCheckpoint
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.errors import CheckpointRefused
from eval_worker.evaluation.evaluate import evaluate_many
from eval_worker.evaluation.feature_cache import FeatureCache
from eval_worker.evaluation.heads_cache import HeadsCache
from eval_worker.evaluation.options import EvalOptions
from eval_worker.evaluation.source import FeatureSource
from eval_worker.families import FAMILIES
from eval_worker.settings import EvaluateSettings
from schemas.model import ModelInfo
from schemas.prompts import PromptStatus
from schemas.report import EvalReport
from schemas.sampling import GREEDY, GREEDY_SETTING, DraftSampling, trees_problem
from schemas.trees import EagleTreeShape

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


def check_trees_greedy(client: CacheClient, prompt_ids: Sequence[Sequence[str]]) -> None:
    """ValueError (one line) when trees are asked of prompts whose responses are all sampled at T > 0."""
    settings = {s.prompt_id: (s.sampling or GREEDY).setting for s in client.prompts()}
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


def evaluate_checkpoints(
    client: CacheClient,
    checkpoints: Sequence[Path | LoadedCheckpoint],
    settings: EvaluateSettings,
    *,
    prompt_ids: Sequence[Sequence[str] | None] | None = None,
    tree_budgets: Sequence[int] = (),
    eagle_trees: Sequence[EagleTreeShape] = (),
    steps: int | None = None,
    draft_sampling: DraftSampling = "greedy",
    sets: Sequence[str] = (),
    set_members_of: Sequence[Mapping[str, Sequence[str]]] | None = None,
    layer_ids: Sequence[int] | None = None,
    block_size: int | None = None,
    layer_convention: LayerConvention | None = None,
    config_path: Path | None = None,
    mask_token_id: int | None = None,
    progress: bool = True,
    features: FeatureCache | None = None,
    source: FeatureSource | None = None,
) -> list[EvalReport]:
    """Load each checkpoint strictly for the server's target and evaluate them together; checkpoint i
    on `prompt_ids[i]` (None: every registered prompt the target has not failed on, or of `sets`), each
    report summarized per set too when the prompts come from sets (`set_members_of[i]`, as a job's
    claim carries them, or `sets` looked up on the server).

    DDTree budgets apply to the DFlash checkpoints, `eagle_trees` and `steps` to the EAGLE-3 ones; an
    option that applies to none of them is refused rather than ignored. Features and heads come from
    `source` when given (a view of the client's, as the doctor's readings are), else from the client."""
    info = client.model()
    loaded = []
    for c in checkpoints:
        if isinstance(c, LoadedCheckpoint):
            loaded.append(c)
            continue
        try:
            loaded.append(
                load_checkpoint(
                    c,
                    info,
                    config_path=config_path,
                    layer_ids_override=layer_ids,
                    block_size_override=block_size,
                    mask_token_id=mask_token_id,
                    layer_convention=layer_convention,
                )
            )
        except CheckpointRefused as e:  # in a sweep, say which checkpoint
            raise CheckpointRefused(str(e) if str(c) in str(e) else f"{c}: {e}") from None
    applicable = {flag for c in loaded for flag in FAMILIES[c.family].flags}
    given = {"--tree-budget": bool(tree_budgets), "--eagle-tree": bool(eagle_trees), "--steps": steps is not None}
    for flag in (f for f, on in given.items() if on and f not in applicable):
        owner = next(f.title for f in FAMILIES.values() if flag in f.flags)
        raise ValueError(f"{flag} applies to {owner} drafters; none of these checkpoints is one")
    wanted = prompt_ids if prompt_ids is not None else [None] * len(loaded)
    if set_members_of is None:
        members = set_members(client, sets)
        set_members_of = [members] * len(loaded)
    ids = [
        select_prompts(client, p, settings.timeout_s, m, progress=progress)
        for p, m in zip(wanted, set_members_of, strict=True)
    ]
    if tree_budgets or eagle_trees:
        check_trees_greedy(client, ids)
    device = resolve_device(settings.device)
    options = EvalOptions(
        tree_budgets=tuple(tree_budgets),
        eagle_trees=tuple(eagle_trees),
        steps=steps,
        device=str(device),
        dtype=drafter_dtype(settings, device, info),
        progress=progress,
        draft_sampling=draft_sampling,
    )
    heads = HeadsCache(settings.heads_cache)
    return evaluate_many(
        source or client, loaded, ids, heads_cache=heads, options=options, features=features, set_members=set_members_of
    )
