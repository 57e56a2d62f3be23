"""What of a store namespace no reader can reach: every object outside the published hierarchy (the
namespace, prompts and prune records groups, and per published prompt its group, token ids, layers
group and the arrays its manifest lists). After a recovery run, a store should hold nothing else."""

from __future__ import annotations

import json

from cache_server.store.blobs import Blobs
from cache_server.store.chunks import ZARR_JSON
from cache_server.store.prune_record import PRUNES


def unpublished(blobs: Blobs, namespace: str) -> dict[str, int]:
    """Key -> size of each object under `namespace` that is not part of what is published."""
    prompts = f"{namespace}/prompts"
    found = {}
    for o in blobs.objects(namespace):
        if o.key in (f"{namespace}/{ZARR_JSON}", f"{prompts}/{ZARR_JSON}", f"{namespace}/{PRUNES}/{ZARR_JSON}"):
            continue
        parts = o.key[len(prompts) + 1 :].split("/") if o.key.startswith(f"{prompts}/") else []
        if not (len(parts) >= 2 and _published(blobs, f"{prompts}/{parts[0]}", parts[1:])):
            found[o.key] = o.size
    return found


def _published(blobs: Blobs, prompt: str, rest: list[str]) -> bool:
    raw = blobs.get(f"{prompt}/{ZARR_JSON}")
    manifest = json.loads(raw)["attributes"].get("manifest") if raw is not None else None
    if manifest is None:
        return False
    if rest[-1].endswith(".tmp"):  # a local write's file never renamed
        return False
    if rest in ([ZARR_JSON], ["layers", ZARR_JSON]) or rest[0] == "token_ids":
        return True
    return rest[0] in ("layers", "scales") and len(rest) >= 3 and rest[1] in {str(k) for k in manifest["layers"]}
