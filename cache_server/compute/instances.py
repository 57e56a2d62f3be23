"""A server instance's defaults: its name (in `GET /model` and `/metrics`), its coordination database
when none is given, and the take-over of registrations from stores written before that database."""

from __future__ import annotations

import json
import logging
import os
import socket

from cache_server.compute.registry import Registration, Registry
from cache_server.compute.sets import SetRegistry
from cache_server.store.blobs import LocalBlobs
from cache_server.store.hidden_store import HiddenStore

log = logging.getLogger(__name__)

DEFAULT_DB_FILE = "coordination.sqlite"  # the coordination database of a local store, by default
OLD_DB_FILE = "jobs.sqlite"  # its name before it held more than jobs: a store that has one keeps it


def default_instance() -> str:
    """`<host>-<pid>`: unique among the servers sharing a store."""
    return f"{socket.gethostname()}-{os.getpid()}"


def default_db_location(store: HiddenStore) -> str:
    """SQLite next to a local store (`coordination.sqlite`, or the `jobs.sqlite` an older server made
    there); an S3 store needs a database named explicitly."""
    if not isinstance(store.blobs, LocalBlobs):
        raise ValueError(f"store {store.blobs.location}: a coordination database (--db) is required with an S3 store")
    root = store.blobs.root
    old = root / OLD_DB_FILE
    return str(old if old.exists() and not (root / DEFAULT_DB_FILE).exists() else root / DEFAULT_DB_FILE)


def import_store_registrations(store: HiddenStore, registry: Registry, sets: SetRegistry) -> None:
    """Registrations and sets that older servers kept in the store (`<namespace>/requests/*.json`,
    `<namespace>/sets/*.json`) into an empty database; the objects are left in place."""
    if registry.all():
        return
    blobs, ns = store.blobs, store.namespace
    kept = [
        blobs.get(o.key)
        for o in sorted(blobs.objects(f"{ns}/requests", recursive=False), key=lambda o: o.key)
        if o.key.endswith(".json")
    ]
    found = len(registry.add_many([Registration.model_validate_json(raw) for raw in kept if raw is not None]))
    for o in blobs.objects(f"{ns}/sets", recursive=False):
        raw = blobs.get(o.key) if o.key.endswith(".json") else None
        if raw is not None:
            sets.add(o.key.rsplit("/", 1)[-1].removesuffix(".json"), json.loads(raw))
    if found:
        log.info("took over %d registrations kept in the store by an older server", found)
