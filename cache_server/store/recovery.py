"""What an interrupted write can leave in a store namespace, swept on open; and the lock that
makes one HiddenStore per namespace (sweeping would destroy a live writer's staging area)."""

from __future__ import annotations

import fcntl
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

from cache_server.store.hierarchy import GROUP, OLD_MANIFEST, is_published, migrate
from cache_server.store.manifest import PromptManifest, StoreError

log = logging.getLogger(__name__)


def lock_namespace(ns: Path) -> IO[str]:
    """An exclusive lock on `ns`, held while the returned file stays open."""
    f = open(ns / ".lock", "a")  # noqa: SIM115  # held open for the store's lifetime
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        f.close()
        raise StoreError(f"{ns} is already open by another HiddenStore") from e
    return f


def sweep_interrupted_writes(prompts: Path, tmp: Path, manifest: Callable[[str], PromptManifest | None]) -> None:
    """Delete what interrupted writes left: staging dirs, unpublished prompts, unlisted layers, temp
    files; and migrate prompts of an older store to prompt groups (`hierarchy.migrate`)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for stray in prompts.glob(f"{GROUP}.*"):
        stray.unlink()
    for prompt_dir in prompts.iterdir():
        if not prompt_dir.is_dir():
            continue  # the group's own zarr.json
        for stray in [*prompt_dir.glob(f"{GROUP}.*"), *prompt_dir.glob(f"{OLD_MANIFEST}.*")]:
            stray.unlink()
        if not is_published(prompt_dir):
            log.info("removing unpublished prompt dir %s", prompt_dir)
            shutil.rmtree(prompt_dir, ignore_errors=True)
            continue
        try:
            m = manifest(prompt_dir.name)
        except StoreError as e:
            log.warning("leaving unreadable prompt %s in place: %s", prompt_dir.name, e)
            continue
        if migrate(prompt_dir):
            log.info("migrated prompt %s to a prompt group", prompt_dir.name)
        listed = {str(k) for k in m.layers} if m else set()
        layers_dir = prompt_dir / "layers"
        for layer_dir in layers_dir.iterdir() if layers_dir.is_dir() else ():
            if layer_dir.is_dir() and layer_dir.name not in listed:
                log.info("removing unpublished layer dir %s", layer_dir)
                shutil.rmtree(layer_dir, ignore_errors=True)
