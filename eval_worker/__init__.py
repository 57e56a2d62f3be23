"""Evaluate DFlash drafter checkpoints against cached target hidden states (chain and DDTree tau)."""

from eval_worker.acceptance import chain_round_taus, tree_round_taus
from eval_worker.batched import AnchorDrafts, draft_anchors
from eval_worker.checkpoint import (
    LoadedCheckpoint,
    load_checkpoint,
    save_hf_checkpoint,
    save_torch_checkpoint,
)
from eval_worker.ddtree import DraftTree, accepted_nodes, build_tree
from eval_worker.drafter import DFlashDrafter, draft_block
from eval_worker.drafter_config import DrafterConfig
from eval_worker.errors import CheckpointRefused, EvalWorkerError, FeatureMismatch
from eval_worker.evaluate import EvalOptions, evaluate, score_prompt
from eval_worker.features import FeatureSource, HiddenResult, TargetHeads
from eval_worker.heads_cache import HeadsCache
from eval_worker.layer_ids import default_layer_ids

__all__ = [
    "AnchorDrafts",
    "CheckpointRefused",
    "DFlashDrafter",
    "DraftTree",
    "DrafterConfig",
    "EvalOptions",
    "EvalWorkerError",
    "FeatureMismatch",
    "FeatureSource",
    "HeadsCache",
    "HiddenResult",
    "LoadedCheckpoint",
    "TargetHeads",
    "accepted_nodes",
    "build_tree",
    "chain_round_taus",
    "default_layer_ids",
    "draft_anchors",
    "draft_block",
    "evaluate",
    "load_checkpoint",
    "save_hf_checkpoint",
    "save_torch_checkpoint",
    "score_prompt",
    "tree_round_taus",
]
