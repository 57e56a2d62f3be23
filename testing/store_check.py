"""What a store must show after a crash: every prompt as one of its allowed versions (old or new),
bit for bit, or absent where that is allowed (and then captured again without trouble); and the
workloads the crash explorers run (`crash_states.py` locally, `s3_faults.py` on S3), on tiny arrays."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from cache_server.store import publish
from cache_server.store.blobs import Blobs
from cache_server.store.hidden_store import HiddenStore
from cache_server.store.prune import prune
from cache_server.store.recovery import sweep_orphans
from cache_server.torch_utils import as_numpy

H, T, PROMPT_LEN = 8, 4, 2
TOKENS = np.arange(100, 100 + T)


@dataclass(frozen=True)
class Version:
    """A prompt as published: the layers its manifest lists (token ids are `TOKENS`)."""

    layers: frozenset[int]


Allowed = Mapping[str, tuple[Version | None, ...]]  # None: the prompt may be absent
Ack = Callable[[str, Version], None]  # a step finished: from now on the prompt must be this version


def layer(pid: str, k: int) -> torch.Tensor:
    """Layer `k` of prompt `pid`: tiny, bf16, different for every (pid, k)."""
    seed = k + 1000 * sum(map(ord, pid))
    return torch.randn(T, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def open_store(blobs: Blobs, *, orphan_grace_s: float = math.inf) -> HiddenStore:
    """The namespace the workloads write (one read thread: the operations come in a fixed order)."""
    return HiddenStore(
        blobs,
        fingerprint="crash",
        model_name="m",
        hidden_size=H,
        dtype=torch.bfloat16,
        read_threads=1,
        orphan_grace_s=orphan_grace_s,
    )


def write(store: HiddenStore, pid: str, layers: frozenset[int]) -> Version:
    """Publish `layers` of `pid` (adding them to a published prompt)."""
    store.write(pid, TOKENS, PROMPT_LEN, {k: layer(pid, k) for k in layers})
    return Version(layers)


def check_store(blobs: Blobs, allowed: Allowed) -> list[str]:
    """Open the store as a server starts (orphans of any age swept first), then check each prompt."""
    with open_store(blobs, orphan_grace_s=0) as store:
        store.swept.result()
        on_disk = store.blobs.children(f"{store.namespace}/prompts")
        return [p for pid in sorted(set(allowed) | set(on_disk)) for p in _check(store, pid, allowed.get(pid, (None,)))]


def _check(store: HiddenStore, pid: str, versions: tuple[Version | None, ...]) -> list[str]:
    try:
        m = store.manifest(pid, fresh=True)
        if m is None:
            if None not in versions:
                return [f"{pid}: absent"]
            final = versions[-1]
            if final is not None:  # what a server does next: capture it again
                write(store, pid, final.layers)
                return [f"{pid} captured again: {p}" for p in _read(store, pid, final)]
            return []
        matching = [v for v in versions if v is not None and v.layers == frozenset(m.layers)]
        if not matching:
            return [f"{pid}: layers {list(m.layers)} are no allowed version's {versions}"]
        return _read(store, pid, matching[0])
    except Exception as e:  # any error reading a prompt is a finding
        return [f"{pid}: {type(e).__name__}: {e}"]


def _read(store: HiddenStore, pid: str, version: Version) -> list[str]:
    m = store.manifest(pid, fresh=True)
    if m is None or m.prompt_len != PROMPT_LEN or frozenset(m.layers) != version.layers:
        return [f"{pid}: manifest {m} is not {version}"]
    if not np.array_equal(store.token_ids(pid), TOKENS):
        return [f"{pid}: wrong token ids"]
    ks = sorted(version.layers)
    out = np.empty((T, len(ks) * H), store.numpy_dtype)
    store.read_into(pid, ks, out)
    want = np.concatenate([as_numpy(layer(pid, k)) for k in ks], axis=1)
    return [] if out.tobytes() == want.tobytes() else [f"{pid}: wrong bytes"]


@dataclass(frozen=True)
class Workload:
    """What is in the store before (`setup`), what runs (`act`, acknowledging each finished step) and
    the versions each prompt may show after a crash during it, before its step is acknowledged."""

    name: str
    setup: Callable[[HiddenStore], None]
    act: Callable[[HiddenStore, Ack], None]
    allowed: Allowed


def _capture(store: HiddenStore, ack: Ack) -> None:
    for pid in ("a", "b"):
        ack(pid, write(store, pid, frozenset({0, 1})))


def _add_layers(store: HiddenStore, ack: Ack) -> None:
    ack("a", write(store, "a", frozenset({0, 1, 2, 3})))


def _two_prompts(store: HiddenStore) -> None:
    for pid in ("a", "b"):
        write(store, pid, frozenset({0, 1, 2}))


def _prune(store: HiddenStore, ack: Ack) -> None:
    prune(store, [1], grace_s=0, sleep=lambda _: None)
    for pid in ("a", "b"):
        ack(pid, Version(frozenset({1})))


def _leftovers(store: HiddenStore) -> None:
    """A published prompt beside what interrupted writes leave: an unpublished prompt's arrays, a
    layer its manifest does not list, a temporary file of a write that never renamed."""
    _one_prompt(store)
    base = f"{store.namespace}/prompts"
    with ThreadPoolExecutor(1) as pool:
        publish.put_prompt(store.blobs, pool, f"{base}/x", {0: as_numpy(layer("x", 0)).view(np.uint16)}, TOKENS)
    publish.write_array(store.blobs, f"{base}/a/layers/5", as_numpy(layer("a", 5)).view(np.uint16), compress=True)
    store.blobs.put(f"{base}/a/zarr.json.0123456789abcdef0123456789abcdef.tmp", b"{")


def _sweep(store: HiddenStore, ack: Ack) -> None:
    sweep_orphans(store.blobs, f"{store.namespace}/prompts", store.manifest, grace_s=0)
    ack("a", Version(frozenset({0, 1})))


def _v(*layers: int) -> Version:
    return Version(frozenset(layers))


def _one_prompt(store: HiddenStore) -> None:
    write(store, "a", frozenset({0, 1}))


WORKLOADS = (
    Workload("capture", lambda _: None, _capture, {"a": (None, _v(0, 1)), "b": (None, _v(0, 1))}),
    Workload("add layers", _one_prompt, _add_layers, {"a": (_v(0, 1), _v(0, 1, 2, 3))}),
    Workload("prune", _two_prompts, _prune, {pid: (_v(0, 1, 2), _v(1)) for pid in ("a", "b")}),
    Workload("orphan sweep", _leftovers, _sweep, {"a": (_v(0, 1),), "x": (None,)}),
)


def allowed_after(workload: Workload, acked: Mapping[str, Version]) -> Allowed:
    """The versions each prompt may show once the steps in `acked` were acknowledged."""
    return {pid: (acked[pid],) if pid in acked else versions for pid, versions in workload.allowed.items()}
