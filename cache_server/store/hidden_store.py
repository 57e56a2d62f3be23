"""Per-prompt, per-layer hidden states in a Zarr v3 hierarchy (`hierarchy.py`) under a target's
fingerprint: `prompts/<id>/{zarr.json, token_ids/, layers/<k>/}`, arrays staged under `tmp/` and
renamed in (`publish.py`), the prompt group's manifest written last: the only source of truth.
Reads: `reader.py`, `blosc_reader.py`; errors and the manifest: `manifest.py`; recovery: `recovery.py`.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from cache_server.store import chunks, hierarchy, publish
from cache_server.store.manifest import (
    LayersNotStored,
    PromptManifest,
    PromptNotStored,
    StoreCorrupt,
    StoreInputError,
    check_name,
    layer_id,
    parse_manifest,
    token_sha256,
)
from cache_server.store.ram_cache import RamCache
from cache_server.store.reader import READ_ERRORS, EncodedPiece, LayerRead, LayerReader
from cache_server.store.recovery import lock_namespace, sweep_interrupted_writes
from cache_server.torch_utils import dtype_name
from schemas.dtypes import DTYPE_NAMES
from schemas.layers import LAYER_CONVENTION
from schemas.safetensors_frame import numpy_dtype

log = logging.getLogger(__name__)


class HiddenStore:
    """One model's hidden states under `root / fingerprint`.

    One HiddenStore per namespace at a time (a lock file enforces it across processes): opening
    deletes leftovers of interrupted writes, which would destroy a live writer's staging area.
    The caller (a single-flight scheduler) never writes one prompt from two threads at once; a
    per-prompt lock here guards it anyway. Reads need no lock: published files never change.
    """

    def __init__(
        self,
        root: Path,
        *,
        fingerprint: str,
        model_name: str,
        hidden_size: int,
        dtype: torch.dtype,
        read_threads: int = 4,
        ram_cache: RamCache | None = None,
    ) -> None:
        check_name(fingerprint, "fingerprint")
        if dtype_name(dtype) not in DTYPE_NAMES:
            raise StoreInputError(f"dtype {dtype} not supported ({', '.join(DTYPE_NAMES)})")
        if hidden_size < 1 or read_threads < 1:
            raise StoreInputError("hidden_size and read_threads must be >= 1")
        self.fingerprint = fingerprint
        self.model_name = model_name
        self.hidden_size = hidden_size
        self.dtype = dtype
        self._dtype_name = dtype_name(dtype)
        self._storage_dtype = chunks.storage_dtype(self._dtype_name)
        self._ns = Path(root) / fingerprint
        self._prompts = self._ns / "prompts"
        self._tmp = self._ns / "tmp"
        self._prompts.mkdir(parents=True, exist_ok=True)
        self._lock_file = lock_namespace(self._ns)
        namespace = {"fingerprint": fingerprint, "model_name": model_name, "dtype": self._dtype_name,
                     "hidden_size": hidden_size, "layer_convention": LAYER_CONVENTION}  # fmt: skip
        hierarchy.ensure_group(self._ns, {"hidden_state_cache": namespace})
        hierarchy.ensure_group(self._prompts)
        self._manifests: dict[str, PromptManifest] = {}
        self._guard = threading.Lock()
        self._prompt_locks: dict[str, threading.Lock] = {}
        self._ram = ram_cache
        self._reader = LayerReader(
            self._prompts, hidden_size=hidden_size, storage_dtype=self._storage_dtype, threads=read_threads
        )
        try:
            sweep_interrupted_writes(self._prompts, self._tmp, self.manifest)
        except BaseException:
            self.close()
            raise

    # -- public -------------------------------------------------------------------------------

    @property
    def namespace(self) -> Path:
        """The directory of this target's states."""
        return self._ns

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """Element type of `read_into`'s `out` (ml_dtypes.bfloat16 for bf16): the tensor's exact bytes."""
        return numpy_dtype(self._dtype_name)

    def close(self) -> None:
        """Stop the read pool and release the namespace lock."""
        self._reader.close()
        self._lock_file.close()

    def __enter__(self) -> HiddenStore:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def manifest(self, prompt_id: str) -> PromptManifest | None:
        """The published manifest, or None (unknown id, or an unfinished write)."""
        check_name(prompt_id, "prompt id")
        with self._guard:
            cached = self._manifests.get(prompt_id)
        if cached is not None:
            return cached
        text = hierarchy.manifest_text(self._prompts / prompt_id)
        if text is None:
            return None
        loaded = parse_manifest(text, prompt_id, (self.fingerprint, self._dtype_name, self.hidden_size))
        with self._guard:
            self._manifests[prompt_id] = loaded
        return loaded

    def token_ids(self, prompt_id: str) -> np.ndarray:
        """int64 [T], checked against the manifest's hash."""
        m = self._require(prompt_id)
        try:
            ids = np.asarray(self._reader.open(prompt_id, "token_ids")[:], dtype=np.int64)
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {prompt_id!r}: token ids unreadable: {e}") from e
        if token_sha256(ids) != m.token_sha256:
            raise StoreCorrupt(f"prompt {prompt_id!r}: token ids do not match the manifest's hash")
        return ids

    def write(
        self,
        prompt_id: str,
        token_ids: np.ndarray,
        prompt_len: int,
        layers: Mapping[int, torch.Tensor],
        *,
        greedy_mismatches: int | None = None,
    ) -> PromptManifest:
        """Publish `layers` ({k: [T, H] CPU tensor}); on a published prompt, add the ones it lacks
        (its manifest keeps the first write's `greedy_mismatches`)."""
        check_name(prompt_id, "prompt id")
        ids = publish.check_tokens(token_ids, prompt_len)
        shape, storage = (len(ids), self.hidden_size), self._storage_dtype
        data = {layer_id(k): publish.layer_bytes(k, t, shape, self.dtype, storage) for k, t in layers.items()}
        data = dict(sorted(data.items()))
        if not data:
            raise StoreInputError("write needs at least one layer")
        sha = token_sha256(ids)
        with self._prompt_lock(prompt_id):
            old = self.manifest(prompt_id)
            if old is not None:
                if old.token_sha256 != sha or old.prompt_len != prompt_len:
                    raise StoreInputError(
                        f"prompt {prompt_id!r} is stored with other token ids or prompt_len "
                        f"({old.num_tokens} tokens, prompt_len {old.prompt_len})"
                    )
                data = {k: v for k, v in data.items() if k not in old.layers}
                if not data:
                    return old
            staging = self._tmp / uuid.uuid4().hex
            try:
                publish.stage(staging, data, ids if old is None else None)
                return self._publish(prompt_id, staging, old, ids, prompt_len, sorted(data), greedy_mismatches)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def read_into(
        self,
        prompt_id: str,
        layers: Sequence[int],
        out: np.ndarray,
        start: int = 0,
        stop: int | None = None,
    ) -> None:
        """Fill `out[:, i*H:(i+1)*H]` with rows start:stop of layer `layers[i]`, in request order.

        `out` is `[stop - start, len(layers) * H]` of `numpy_dtype`, typically a view into a
        response buffer (`reader.py` fills it on a thread pool). With a RAM cache, layers found there
        are copied, and the others are decoded whole and kept.
        """
        m, stop = self._checked(prompt_id, layers, start, stop)
        h = self.hidden_size
        want = (stop - start, len(layers) * h)
        if out.dtype != self.numpy_dtype or out.shape != want or not out.flags.writeable:
            raise StoreInputError(
                f"out must be a writeable {self.numpy_dtype} array of shape {want}, got {out.dtype} {out.shape}"
            )
        if stop == start or not layers:
            return
        raw, ram = out.view(self._storage_dtype), self._ram
        reads: list[LayerRead] = []
        decoded: list[tuple[int, np.ndarray, np.ndarray]] = []  # (layer, whole layer, its columns in out)
        for i, k in enumerate(layers):
            columns = raw[:, i * h : (i + 1) * h]  # [stop - start, H]
            if ram is None:
                reads.append((k, columns, start, stop))
                continue
            cached = ram.get(self.fingerprint, prompt_id, k)
            if cached is not None:
                columns[...] = cached[start:stop]
                continue
            whole = np.empty((m.num_tokens, h), self._storage_dtype)  # decoded whole, to be kept
            reads.append((k, whole, 0, m.num_tokens))
            decoded.append((k, whole, columns))
        self._reader.read(m, reads)
        for k, whole, columns in decoded:
            columns[...] = whole[start:stop]
            ram.put(self.fingerprint, prompt_id, k, whole)  # type: ignore[union-attr]

    def encoded(self, prompt_id: str, layers: Sequence[int], start: int, stop: int) -> list[list[EncodedPiece]]:
        """Per layer (request order), rows start:stop as stored: Blosc chunks cut to the blocks the rows
        need, or raw rows (RAM-cached, stored uncompressed, or of another layout: decoded here)."""
        m, _ = self._checked(prompt_id, layers, start, stop)
        cached = {k: self._ram.get(self.fingerprint, prompt_id, k) if self._ram is not None else None for k in layers}
        on_disk = [k for k in layers if cached[k] is None]
        stored = dict(zip(on_disk, self._reader.encoded(m, on_disk, start, stop), strict=True))
        out = []
        for k in layers:
            pieces, rows = stored.get(k), cached[k]
            if pieces is None:  # sent decoded: from RAM (no copy: cached arrays never change), or decoded here
                if rows is None:
                    part = np.empty((stop - start, self.hidden_size), self._storage_dtype)
                    self._reader.read(m, [(k, part, start, stop)])
                else:
                    part = rows[start:stop]
                raw = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
                pieces = [(0, stop - start, "raw", memoryview(raw.data), 0)]
            out.append(pieces)
        return out

    def _checked(
        self, prompt_id: str, layers: Sequence[int], start: int, stop: int | None
    ) -> tuple[PromptManifest, int]:
        m = self._require(prompt_id)
        missing = sorted(set(layers) - set(m.layers))
        if missing:
            raise LayersNotStored(prompt_id, missing)
        stop = m.num_tokens if stop is None else stop
        if not 0 <= start <= stop <= m.num_tokens:
            raise StoreInputError(f"rows [{start}, {stop}) outside prompt {prompt_id!r} of {m.num_tokens}")
        return m, stop

    # -- reading --------------------------------------------------------------------------------

    def _require(self, prompt_id: str) -> PromptManifest:
        m = self.manifest(prompt_id)
        if m is None:
            raise PromptNotStored(f"prompt {prompt_id!r} is not stored for model {self.fingerprint}")
        return m

    # -- writing --------------------------------------------------------------------------------

    def _publish(
        self,
        prompt_id: str,
        staging: Path,
        old: PromptManifest | None,
        ids: np.ndarray,
        prompt_len: int,
        new_layers: list[int],
        greedy_mismatches: int | None,
    ) -> PromptManifest:
        prompt_dir = publish.move_in(self._prompts, prompt_id, staging, new_prompt=old is None, layers=new_layers)
        m = old.model_copy(update={"layers": tuple(sorted({*new_layers, *old.layers}))}) if old else PromptManifest(
            prompt_id=prompt_id, model_fingerprint=self.fingerprint, model_name=self.model_name,
            dtype=self._dtype_name,  # type: ignore[arg-type]  # checked in __init__
            layers=tuple(sorted(new_layers)), prompt_len=prompt_len, num_tokens=len(ids),
            hidden_size=self.hidden_size, token_sha256=token_sha256(ids),
            codec=chunks.describe(self._storage_dtype.itemsize), created_at=datetime.now(UTC).isoformat(),
            greedy_mismatches=greedy_mismatches,
        )  # fmt: skip
        hierarchy.publish_manifest(prompt_dir, m.model_dump(mode="json"))
        with self._guard:
            self._manifests[prompt_id] = m
        return m

    @contextmanager
    def _prompt_lock(self, prompt_id: str) -> Iterator[None]:
        with self._guard:
            lock = self._prompt_locks.setdefault(prompt_id, threading.Lock())
        with lock:
            yield
