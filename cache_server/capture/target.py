"""The target: its tokenizer, its heads and the capturer that computes its layers, with what the
server says about it (`schemas.model.TargetDescription`). `open_hf_target` loads the model in this
process, whose forward generates and captures; an engine-captured target (`generation/engine_target.py`) loads only the
tokenizer and the heads, and the serving engine computes the layers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig

from cache_server.capture.captured import Capturer
from cache_server.capture.fingerprint import target_fingerprint
from cache_server.capture.heads import Heads
from cache_server.capture.hf_forward import HfForward
from cache_server.capture.model_dir import check_model_dir
from cache_server.capture.tokenizer import PromptTokenizer
from cache_server.torch_utils import resolve_device, resolve_dtype
from schemas.model import TargetDescription
from schemas.storage import StorageName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    """What the target's config.json says of its shape."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int

    @classmethod
    def of(cls, model_dir: Path) -> ModelShape:
        """Read from `model_dir`'s config (the text model's, for a multimodal one)."""
        cfg = AutoConfig.from_pretrained(model_dir).get_text_config()
        return cls(
            num_layers=int(cfg.num_hidden_layers),
            hidden_size=int(cfg.hidden_size),
            vocab_size=int(cfg.vocab_size),
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 1 << 30)),
        )

    def tokenizer(self, model_dir: Path) -> PromptTokenizer:
        """The target's tokenizer, checking ids and lengths against this shape."""
        return PromptTokenizer(
            model_dir, vocab_size=self.vocab_size, max_position_embeddings=self.max_position_embeddings
        )


@dataclass(frozen=True)
class Target:
    """A target as the server uses it. `forward` is the in-process model when there is one (it then
    generates responses and is the capturer); an engine-captured target has none."""

    info: TargetDescription
    prompts: PromptTokenizer
    heads: Heads
    capturer: Capturer
    forward: HfForward | None


def target_info(model_dir: Path, shape: ModelShape, capturer: Capturer, storage: StorageName) -> TargetDescription:
    """The target as `GET /model` describes it, its fingerprint covering how it is captured and stored."""
    dtype = capturer.info.dtype
    fingerprint = target_fingerprint(model_dir, dtype, storage, capturer.info.fingerprint_part())
    name, how = model_dir.resolve().name, capturer.info.describe()
    log.info("target %s captured by %s (fingerprint %s)", name, how, fingerprint)
    return TargetDescription(
        name=name,
        fingerprint=fingerprint,
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        vocab_size=shape.vocab_size,
        max_position_embeddings=shape.max_position_embeddings,
        dtype=dtype,
        storage=storage,
        capture=capturer.info,
    )


def open_hf_target(
    model_dir: Path,
    *,
    device: str = "auto",
    dtype: str | None = None,
    device_map: str | None = None,
    storage: StorageName = "exact",
) -> Target:
    """The target loaded in this process (`device_map` spreads it over devices, as transformers takes
    it); `storage` is how the store will keep the states: part of the fingerprint."""
    check_model_dir(model_dir)
    torch_device = resolve_device("auto" if device_map is not None else device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    shape = ModelShape.of(model_dir)
    prompts = shape.tokenizer(model_dir)
    forward = HfForward(
        model_dir,
        device=torch_device,
        dtype=torch_dtype,
        device_map=device_map,
        pad_token_id=prompts.pad_token_id,
        stop_token_ids=prompts.stop_token_ids,
    )
    info = target_info(model_dir, shape, forward, storage)
    return Target(info, prompts, Heads.from_model(forward.model), forward, forward)
