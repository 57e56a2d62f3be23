"""Per-prompt, per-layer hidden states in a Zarr v3 hierarchy (`hierarchy.py`) under a target's
fingerprint: `prompts/<id>/{zarr.json, token_ids/, layers/<k>/}`, in a local directory or an S3
bucket (`blobs.py`). Arrays are written under their final keys (`publish.py`) and the prompt group's
manifest last: the only source of truth. Reads: `reader.py`, `blosc_reader.py`; the manifest:
`manifest.py`, errors: `errors.py`; orphans of interrupted writes: `recovery.py`."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from cache_server.store import chunks, hierarchy, publish
from cache_server.store.blobs import Blobs
from cache_server.store.errors import LayersNotStored, PromptNotStored, StoreCorrupt, StoreInputError
from cache_server.store.locations import open_blobs
from cache_server.store.manifest import (
    PromptManifest,
    check_name,
    first_manifest,
    parse_manifest,
    token_sha256,
    with_layers,
    without_layers,
)
from cache_server.store.ram_cache import RamCache
from cache_server.store.reader import READ_ERRORS, EncodedPiece, LayerReader
from cache_server.store.recovery import sweep_orphans
from cache_server.store.stored_rows import StoredRows
from cache_server.torch_utils import dtype_name
from schemas.dtypes import DTYPE_NAMES
from schemas.layers import LAYER_CONVENTION
from schemas.loss_mask import Spans
from schemas.prompts import CaptureInfo, GeneratorInfo
from schemas.safetensors_frame import numpy_dtype
from schemas.sampling import SamplingParams
from schemas.storage import STORAGE_NAMES, StorageName


class HiddenStore:
    """One model's hidden states under `<store>/<fingerprint>`. Any number of HiddenStores, in any
    number of processes, may share a namespace: what they write is invisible until its manifest is, and
    orphans are removed only once older than `orphan_grace_s`. Two writers never write one prompt at
    once: a per-prompt lock within a process, the coordination database's capture leases across them.
    Reads need no lock: published arrays never change, and checksums catch one that did."""

    def __init__(
        self,
        root: Blobs | Path | str,
        *,
        fingerprint: str,
        model_name: str,
        hidden_size: int,
        dtype: torch.dtype,
        read_threads: int = 4,
        ram_cache: RamCache | None = None,
        orphan_grace_s: float = 900.0,
        storage: StorageName = "exact",
    ) -> None:
        """`storage`: `exact`, or `float8_e4m3fn` (`schemas/storage.py`; its fingerprint must differ)."""
        check_name(fingerprint, "fingerprint")
        if dtype_name(dtype) not in DTYPE_NAMES:
            raise StoreInputError(f"dtype {dtype} not supported ({', '.join(DTYPE_NAMES)})")
        if storage not in STORAGE_NAMES:
            raise StoreInputError(f"storage {storage!r} not supported ({', '.join(STORAGE_NAMES)})")
        if hidden_size < 1 or read_threads < 1:
            raise StoreInputError("hidden_size and read_threads must be >= 1")
        self.blobs = root if not isinstance(root, Path | str) else open_blobs(str(root))
        self.fingerprint = fingerprint
        self.model_name = model_name
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.storage = storage
        self._dtype_name = dtype_name(dtype)
        exact = storage == "exact"
        self._storage_dtype = chunks.storage_dtype(self._dtype_name) if exact else np.dtype(np.uint8)
        self._prompts = f"{fingerprint}/prompts"
        identity: dict[str, Any] = {
            "model_name": model_name,
            "dtype": self._dtype_name,
            "storage": storage,
            "hidden_size": hidden_size,
        }
        self._identity: dict[str, Any] = {
            **identity,
            "fingerprint": fingerprint,
            "codec": chunks.describe(self._storage_dtype.itemsize),
        }
        namespace = {**identity, "fingerprint": fingerprint, "layer_convention": LAYER_CONVENTION}
        hierarchy.ensure_group(self.blobs, fingerprint, {"hidden_state_cache": namespace})
        hierarchy.ensure_group(self.blobs, self._prompts)
        self._manifests: dict[str, PromptManifest] = {}
        self._guard = threading.Lock()
        self._prompt_locks: dict[str, threading.Lock] = {}
        self._reader = LayerReader(
            self.blobs, self._prompts, hidden_size=hidden_size, storage_dtype=self._storage_dtype, threads=read_threads
        )
        self._ram = ram_cache
        fresh = partial(self.manifest, fresh=True)
        self._rows = StoredRows(self._reader, ram_cache, fingerprint, hidden_size, self._storage_dtype, storage, fresh)
        self._writers = ThreadPoolExecutor(max_workers=read_threads, thread_name_prefix="hidden-store-write")
        self.blobs.delete(f"{fingerprint}/tmp")  # the staging area of stores written before: never written now
        self._closing = threading.Event()
        # In the background (listing every prompt of an S3 store takes a while; readers never see
        # orphans anyway); `swept` resolves to how many were removed.
        self.swept = self._writers.submit(
            sweep_orphans, self.blobs, self._prompts, self.manifest, grace_s=orphan_grace_s, stop=self._closing
        )

    @property
    def namespace(self) -> str:
        """The key prefix of this target's states (its fingerprint)."""
        return self.fingerprint

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """Element type of `read_into`'s `out` (ml_dtypes.bfloat16 for bf16): the tensor's exact bytes."""
        return numpy_dtype(self._dtype_name)

    def close(self) -> None:
        """Stop the orphan sweep and the read and write pools."""
        self._closing.set()
        self._reader.close()
        self._writers.shutdown(wait=True)

    def __enter__(self) -> HiddenStore:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def manifest(self, prompt_id: str, *, fresh: bool = False) -> PromptManifest | None:
        """The published manifest, or None (unknown id, or an unfinished write). It is cached once
        read; `fresh` reads it again, for layers another server may have added since."""
        check_name(prompt_id, "prompt id")
        with self._guard:
            cached = None if fresh else self._manifests.get(prompt_id)
        if cached is not None:
            return cached
        text = hierarchy.manifest_text(self.blobs, f"{self._prompts}/{prompt_id}")
        if text is None:
            return None
        expected = (self.fingerprint, self._dtype_name, self.storage, self.hidden_size)
        loaded = parse_manifest(text, prompt_id, expected)
        with self._guard:
            self._manifests[prompt_id] = loaded
        return loaded

    def token_ids(self, prompt_id: str) -> np.ndarray:
        """int64 [T], checked against the manifest's hash."""
        m = self._require(prompt_id)
        try:
            ids = self._reader.token_ids(prompt_id)
        except READ_ERRORS as e:
            raise StoreCorrupt(f"prompt {prompt_id!r}: token ids unreadable: {e}") from e
        if token_sha256(ids) != m.token_sha256:
            raise StoreCorrupt(f"prompt {prompt_id!r}: token ids do not match the manifest's hash")
        return ids

    # the prompt's tokens and layers, then what its manifest says of them, by keyword
    def write(  # noqa: PLR0913
        self,
        prompt_id: str,
        token_ids: np.ndarray,
        prompt_len: int,
        layers: Mapping[int, torch.Tensor],
        *,
        greedy_mismatches: int | None = None,
        generator: GeneratorInfo | None = None,
        sampling: SamplingParams | None = None,
        outside_support: int | None = None,
        capture: CaptureInfo | None = None,
        loss_spans: Spans | None = None,
    ) -> PromptManifest:
        """Publish `layers` ({k: [T, H] CPU tensor}); on a published prompt, add the ones it lacks (its
        manifest keeps the first write's response checks, `generator`, `sampling`, `capture` and
        `loss_spans`)."""
        check_name(prompt_id, "prompt id")
        ids = publish.check_tokens(token_ids, prompt_len)
        data, scales = publish.stored_layers(layers, (len(ids), self.hidden_size), self.dtype, self.storage)
        sha, by_engine = token_sha256(ids), capture if capture is not None and capture.kind == "engine" else None
        with self._prompt_lock(prompt_id):
            old = self.manifest(prompt_id, fresh=True)
            if old is not None:
                if old.token_sha256 != sha or old.prompt_len != prompt_len:
                    raise StoreInputError(
                        f"prompt {prompt_id!r} is stored with other token ids or prompt_len "
                        f"({old.num_tokens} tokens, prompt_len {old.prompt_len})"
                    )
                data = {k: v for k, v in data.items() if k not in old.layers}
                if not data:
                    return old
                scales = {k: scales[k] for k in data} if scales is not None else None
            # What this server read of these layers before (a prune dropped them since) is not what
            # it is about to write: a capture's last bits may differ, and so do the checksums.
            self._forget_read(prompt_id, list(data))
            base = f"{self._prompts}/{prompt_id}"
            crc32, scale_crc32 = publish.put_prompt(
                self.blobs, self._writers, base, data, ids if old is None else None, scales
            )
            m = (
                with_layers(old, crc32, scale_crc32)
                if old is not None
                else first_manifest(
                    prompt_id, ids, prompt_len, crc32, scale_crc32, greedy_mismatches, generator, **self._identity
                ).model_copy(
                    update={
                        "sampling": sampling,
                        "outside_support": outside_support,
                        "capture": by_engine,
                        "loss_spans": _checked_spans(loss_spans, len(ids)),
                    }
                )
            )
            publish_it = partial(self._publish, m, new=old is None)
            return publish.published_or_discarded(self.blobs, base, crc32, scale_crc32, publish_it)

    def forget_layers(self, prompt_id: str, layers: Sequence[int]) -> tuple[int, ...]:
        """Stop serving `layers` of a published prompt (their files do not decode, or are pruned): its
        manifest is published again without them, so the next request for them captures them again.
        Their files are left (`prune.py` deletes them later). Returns the layers it held of these."""
        with self._prompt_lock(prompt_id):
            old = self.manifest(prompt_id, fresh=True)
            held = tuple(k for k in old.layers if k in layers) if old is not None else ()
            if old is None or not held:
                return ()
            self._forget_read(prompt_id, held)
            self._publish(without_layers(old, held), new=False)
            return held

    def read_into(
        self, prompt_id: str, layers: Sequence[int], out: np.ndarray, start: int = 0, stop: int | None = None
    ) -> None:
        """Fill `out[:, i*H:(i+1)*H]` with rows start:stop of layer `layers[i]`, in request order.

        `out` is `[stop - start, len(layers) * H]` of `numpy_dtype`, typically a view into a
        response buffer (`reader.py` fills it on a thread pool). An FP8 store's rows are dequantized
        into it (`schemas.storage.dequantize`).
        """
        m, stop = self._checked(prompt_id, layers, start, stop)
        want = (stop - start, len(layers) * self.hidden_size)
        if out.dtype != self.numpy_dtype or out.shape != want or not out.flags.writeable:
            raise StoreInputError(
                f"out must be a writeable {self.numpy_dtype} array of shape {want}, got {out.dtype} {out.shape}"
            )
        if stop == start or not layers:
            return
        self._rows.values(m, layers, out, start, stop)

    def encoded(self, prompt_id: str, layers: Sequence[int], start: int, stop: int) -> list[list[EncodedPiece]]:
        """Per layer (request order), rows start:stop as stored (`StoredRows.encoded`): an FP8 store's
        bytes, to be dequantized with `scales`."""
        m, _ = self._checked(prompt_id, layers, start, stop)
        return self._rows.encoded(m, layers, start, stop)

    def scales(self, prompt_id: str, layers: Sequence[int], start: int, stop: int) -> np.ndarray:
        """An FP8 store's scales of rows start:stop, float32 [len(layers), stop - start]."""
        if self.storage == "exact":
            raise StoreInputError("an exact store has no scales")
        m, _ = self._checked(prompt_id, layers, start, stop)
        return self._rows.scales(m, layers, start, stop)

    def _checked(
        self, prompt_id: str, layers: Sequence[int], start: int, stop: int | None
    ) -> tuple[PromptManifest, int]:
        m = self._require(prompt_id)
        if not set(layers) <= set(m.layers):  # another server may have added them since
            m = self._require(prompt_id, fresh=True)
        missing = sorted(set(layers) - set(m.layers))
        if missing:
            raise LayersNotStored(prompt_id, missing)
        stop = m.num_tokens if stop is None else stop
        if not 0 <= start <= stop <= m.num_tokens:
            raise StoreInputError(f"rows [{start}, {stop}) outside prompt {prompt_id!r} of {m.num_tokens}")
        return m, stop

    def _forget_read(self, prompt_id: str, layers: Sequence[int]) -> None:
        """Drop the opened arrays and decoded copies of these layers (written again, or dropped)."""
        self._reader.forget(prompt_id, layers)
        if self._ram is not None:
            self._ram.drop(self.fingerprint, prompt_id, layers)

    def _require(self, prompt_id: str, *, fresh: bool = False) -> PromptManifest:
        m = self.manifest(prompt_id, fresh=fresh)
        if m is None:
            raise PromptNotStored(f"prompt {prompt_id!r} is not stored for model {self.fingerprint}")
        return m

    def _publish(self, m: PromptManifest, *, new: bool) -> PromptManifest:
        """Write the manifest, the last step: before it, readers see nothing new."""
        hierarchy.publish_manifest(self.blobs, f"{self._prompts}/{m.prompt_id}", m.as_written(), new=new)
        with self._guard:
            self._manifests[m.prompt_id] = m
        return m

    @contextmanager
    def _prompt_lock(self, prompt_id: str) -> Iterator[None]:
        with self._guard:
            lock = self._prompt_locks.setdefault(prompt_id, threading.Lock())
        with lock:
            yield


def _checked_spans(spans: Spans | None, num_tokens: int) -> Spans | None:
    """`spans` if they are sorted, disjoint ranges inside the prompt's tokens (else StoreInputError)."""
    if spans is None:
        return None
    flat = [i for span in spans for i in span]
    if (
        flat != sorted(flat)
        or any(lo >= hi for lo, hi in spans)
        or (flat and not 0 <= flat[0] <= flat[-1] <= num_tokens)
    ):
        raise StoreInputError(f"loss spans {list(spans)} are not sorted, disjoint ranges within {num_tokens} tokens")
    return spans
