"""What must hold before any math: the heads and every prompt's features fit the checkpoint and the
target, or the run stops with a typed error rather than producing a number."""

from __future__ import annotations

from cache_server.client import TargetHeads
from eval_worker.checkpoints.loaded_checkpoint import LoadedCheckpoint
from eval_worker.errors import CheckpointRefused, FeatureMismatch
from eval_worker.evaluation.feature_cache import Features
from schemas.layers import LAYER_CONVENTION
from schemas.model import ModelInfo


def check_heads(heads: TargetHeads, info: ModelInfo) -> None:
    """FeatureMismatch unless embed_tokens and lm_head are [vocab, hidden] of the target."""
    want = (info.vocab_size, info.hidden_size)
    for name, array in (("embed_tokens", heads.embed_tokens), ("lm_head", heads.lm_head)):
        if tuple(array.shape) != want:
            raise FeatureMismatch(f"target {name} has shape {list(array.shape)}, the model says {list(want)}")


def check_features(features: Features, prompt_id: str, fingerprint: str, checkpoint: LoadedCheckpoint) -> None:
    """The served features are the requested layers of the whole sequence of this target, each as wide
    as the drafter reads one (CheckpointRefused otherwise, naming the shapes and layers)."""
    meta, hidden, layers = features.metadata, features.hidden, list(checkpoint.target_layer_ids)
    width = len(layers) * checkpoint.tap_width
    if hidden.dim() != 2 or hidden.shape[1] != width:
        raise CheckpointRefused(
            f"prompt {prompt_id}: served features have shape {list(hidden.shape)}, but the drafter reads "
            f"{len(layers)} layers {layers} of width {checkpoint.tap_width}: {width} per token"
        )
    if meta.layers != layers:
        raise FeatureMismatch(f"prompt {prompt_id}: requested layers {layers}, the cache served {meta.layers}")
    if meta.model_fingerprint != fingerprint:
        raise FeatureMismatch(
            f"prompt {prompt_id}: features are from target {meta.model_fingerprint!r}, heads from {fingerprint!r}"
        )
    if meta.layer_convention != LAYER_CONVENTION:
        raise FeatureMismatch(f"prompt {prompt_id}: layer convention {meta.layer_convention!r} != {LAYER_CONVENTION!r}")
    if meta.hidden_size != checkpoint.tap_width:
        raise FeatureMismatch(
            f"prompt {prompt_id}: features have hidden size {meta.hidden_size}, the drafter reads "
            f"{checkpoint.tap_width}"
        )
    total = features.token_ids.shape[0]
    if hidden.shape[0] != total or meta.start != 0 or meta.stop != total:
        raise FeatureMismatch(
            f"prompt {prompt_id}: need the whole sequence; got hidden rows {hidden.shape[0]}, "
            f"{total} token ids, span [{meta.start}, {meta.stop})"
        )
    if not 1 <= meta.prompt_len <= total:
        raise FeatureMismatch(f"prompt {prompt_id}: prompt_len {meta.prompt_len} outside [1, {total}]")
