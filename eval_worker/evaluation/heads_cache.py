"""A local cache of the target's embed_tokens / lm_head (and final norm), keyed by target fingerprint.

They are the largest download an evaluation needs and are the same for every checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from cache_server.client import TargetHeads
from cache_server.client.results import as_tensor
from cache_server.torch_utils import as_numpy
from eval_worker.errors import FeatureMismatch
from eval_worker.evaluation.source import FeatureSource
from schemas.hidden import EMBED_TENSOR, FINAL_NORM_TENSOR, LM_HEAD_TENSOR, PLAIN_NORM_KIND, ZERO_CENTERED_NORM_KIND

log = logging.getLogger(__name__)

DEFAULT_HEADS_DIR = Path("~/.cache/hidden-state-cache/heads")
_NO_NORM = "none"  # the target's final norm is not an RMSNorm the cache serves
_KINDS = (PLAIN_NORM_KIND, ZERO_CENTERED_NORM_KIND)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class HeadsCache:
    """A directory of `<fingerprint>.safetensors` files, written atomically (replicas share it)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (directory or DEFAULT_HEADS_DIR).expanduser()

    def path_for(self, fingerprint: str) -> Path:
        """Where the heads of target `fingerprint` are kept."""
        name = fingerprint if _SAFE_NAME.match(fingerprint) else hashlib.sha256(fingerprint.encode()).hexdigest()
        return self.directory / f"{name}.safetensors"

    def get(self, source: FeatureSource, fingerprint: str) -> TargetHeads:
        """The heads of target `fingerprint`, from disk if cached, else fetched from `source` and stored."""
        path = self.path_for(fingerprint)
        if path.exists():
            cached = _read(path, fingerprint)
            if cached is not None:
                log.info("target heads from cache %s", path)
                return cached
        heads = source.heads()
        if heads.fingerprint != fingerprint:
            raise FeatureMismatch(
                f"the server's heads are for target {heads.fingerprint!r}, but its model is {fingerprint!r}"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        # unique per writer: worker replicas share this directory (and, in containers, their pid)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        embed, lm_head = heads.to_torch()
        tensors = {EMBED_TENSOR: embed.contiguous(), LM_HEAD_TENSOR: lm_head.contiguous()}
        # the final norm (the doctor's, probabilistic drafting's): its eps and kind, "none" for both without one
        metadata = {"fingerprint": fingerprint, "final_norm_eps": _NO_NORM, "final_norm_kind": _NO_NORM}
        if heads.final_norm is not None and heads.final_norm_eps is not None:
            tensors[FINAL_NORM_TENSOR] = as_tensor(heads.final_norm).contiguous()
            metadata["final_norm_eps"] = repr(heads.final_norm_eps)
            kind = ZERO_CENTERED_NORM_KIND if heads.final_norm_zero_centered else PLAIN_NORM_KIND
            metadata["final_norm_kind"] = kind
        save_file(tensors, tmp, metadata=metadata)
        tmp.replace(path)
        log.info("target heads fetched and cached at %s", path)
        return heads


def _read(path: Path, fingerprint: str) -> TargetHeads | None:
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") != fingerprint:
                log.warning(
                    "ignoring heads cache %s: it holds target %r, not %r", path, meta.get("fingerprint"), fingerprint
                )
                return None
            eps, kind = meta.get("final_norm_eps"), meta.get("final_norm_kind")
            # Fetch again what was written before the final norm was kept, or before norms had kinds (a
            # worker then read every served norm as plain, a zero-centred one too, and a server then served
            # none of those), or a kind this worker cannot apply.
            readable = kind == _NO_NORM if eps == _NO_NORM else kind in _KINDS
            if eps is None or not readable:
                return None
            norm = None if eps == _NO_NORM else as_numpy(f.get_tensor(FINAL_NORM_TENSOR))
            return TargetHeads(
                as_numpy(f.get_tensor(EMBED_TENSOR)),
                as_numpy(f.get_tensor(LM_HEAD_TENSOR)),
                fingerprint,
                norm,
                None if eps == _NO_NORM else float(eps),
                eps != _NO_NORM and kind == ZERO_CENTERED_NORM_KIND,
            )
    except (SafetensorError, OSError, KeyError) as exc:
        log.warning("ignoring unreadable heads cache %s: %s", path, exc)
        return None
