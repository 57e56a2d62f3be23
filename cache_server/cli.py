"""`cache-server tiny-model DIR ...`, `cache-server plan ...`, `cache-server prune ...` and
`cache-server serve ...`. The options
are generated from the settings models (`settings.py`), so each one is also an environment variable."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from cache_server.cli_source import settings_from
from cache_server.settings import PlanSettings, PruneSettings, ServeSettings, TinyModelSettings

if TYPE_CHECKING:  # the commands import what they need when they run: `--help` loads no torch
    from cache_server.coordination.database import Database
    from cache_server.store.hidden_store import HiddenStore


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cache-server",
        description="Run a target LLM once per prompt, cache its hidden states, serve any layer set.",
        epilog="Every serve option can also be set in the environment as CACHE_SERVER_<OPTION>.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("tiny-model", help="write a small random Qwen3-architecture target with a tokenizer")
    tiny.add_argument("dir", type=Path)
    tiny.set_defaults(build_settings=settings_from(tiny, TinyModelSettings))
    plan = sub.add_parser("plan", help="what a capture would store, before it starts (no server needed)")
    plan.set_defaults(build_settings=settings_from(plan, PlanSettings))
    prune = sub.add_parser("prune", help="drop stored layers outside a set (beside running servers)")
    prune.set_defaults(build_settings=settings_from(prune, PruneSettings))
    serve = sub.add_parser("serve", help="serve hidden states over HTTP")
    serve.set_defaults(build_settings=settings_from(serve, ServeSettings))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a `cache-server` command; 2 on bad options."""
    args = _parser().parse_args(argv)
    try:
        settings = args.build_settings(args)
        if isinstance(settings, TinyModelSettings):
            return _tiny_model(args.dir, settings)
        if isinstance(settings, PlanSettings):
            return _plan(settings)
        if isinstance(settings, PruneSettings):
            return _prune(settings)
        _check_startable(settings)
    except (ValidationError, ValueError, FileNotFoundError) as e:
        print(f"cache-server: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        print(f"cache-server needs {e.name}: pip install 'hidden-state-cache[server]'", file=sys.stderr)
        return 2
    return _serve(settings)


def _plan(settings: PlanSettings) -> int:
    from cache_server.capture.model_dir import check_model_dir

    check_model_dir(settings.model)  # as `serve` does, before transformers: one line, no model-hub lookup
    from transformers import AutoConfig

    from cache_server.settings import capture_layer_ids
    from cache_server.store.usage import local_free_bytes
    from schemas.plan import StoragePlan

    cfg = AutoConfig.from_pretrained(settings.model).get_text_config()
    layers, hidden = int(cfg.num_hidden_layers), int(cfg.hidden_size)
    plan = StoragePlan.project(
        target=settings.model.resolve().name,
        num_layers=layers,
        hidden_size=hidden,
        dtype=settings.dtype,
        storage=settings.store_dtype,
        capture_layers=capture_layer_ids(settings.capture_layers, layers),
        prompts=settings.prompts,
        tokens=settings.prompts * settings.tokens,
        free_bytes=local_free_bytes(settings.store) if settings.store is not None else None,
    )
    print("\n".join(plan.lines()))
    return 0


def _prune(settings: PruneSettings) -> int:
    from cache_server.compute.instances import default_instance
    from cache_server.compute.sets import SetRegistry
    from cache_server.coordination.holds import PromptHolds
    from cache_server.store.errors import StoreError
    from cache_server.store.locations import open_blobs
    from cache_server.store.prune import open_namespace, prune
    from schemas.layers import parse_layer_list

    if settings.prompts is not None and settings.set is not None:
        raise ValueError("--prompts and --set choose the prompts two ways: give one")
    keep = parse_layer_list(settings.keep_layers, "--keep-layers")
    if not keep:
        raise ValueError("--keep-layers must name at least one layer")
    if settings.db is None and settings.store.startswith("s3://"):
        raise ValueError(
            "--db is required with an s3:// store: the prune takes capture leases in the servers' database"
        )
    try:
        store = open_namespace(open_blobs(settings.store), settings.namespace)
    except StoreError as e:
        raise ValueError(str(e)) from e
    with store, _prune_database(settings, store) as db:
        ids = [p for p in settings.prompts.split(",") if p] if settings.prompts is not None else None
        if settings.set is not None:
            ids = SetRegistry(db, store.namespace).members(settings.set)
            if ids is None:
                raise ValueError(f"no set named {settings.set!r} in namespace {store.namespace}")
        if not settings.force:
            _check_kept_for_jobs(db, store.namespace, keep, settings.usage_days)
        holds = PromptHolds(db, store.namespace, f"prune-{default_instance()}")
        result = prune(store, keep, ids, grace_s=settings.grace_s, leases=holds)
    print("\n".join(result.lines()))
    return 0


def _check_kept_for_jobs(db: Database, namespace: str, keep: list[int], usage_days: float) -> None:
    """ValueError naming the jobs (and their layers) that keeping only `keep` would take layers from."""
    from cache_server.jobs.layer_usage import jobs_reading, keep_problem
    from cache_server.jobs.queue import JobStore

    readers = jobs_reading(JobStore(db), namespace, since=time.time() - usage_days * 86400)
    problem = keep_problem(readers, keep)
    if problem is not None:
        raise ValueError(problem)


@contextmanager
def _prune_database(settings: PruneSettings, store: HiddenStore) -> Iterator[Database]:
    """The servers' coordination database (`--db`, default the local store's), closed after."""
    from cache_server.compute.instances import default_db_location
    from cache_server.coordination.database import Database

    db = Database(settings.db or default_db_location(store))
    try:
        yield db
    finally:
        db.close()


def _tiny_model(out_dir: Path, tiny: TinyModelSettings) -> int:
    from cache_server.capture.tiny_model import build_tiny_model

    shape = {"layers": tiny.layers, "hidden": tiny.hidden, "vocab": tiny.vocab, "head_dim": tiny.head_dim}
    out = build_tiny_model(out_dir, **shape, seed=tiny.seed, logit_scale=tiny.logit_scale)
    print(
        f"wrote a tiny Qwen3 target ({tiny.layers} layers, hidden {tiny.hidden}, head_dim {tiny.head_dim}, "
        f"vocab {tiny.vocab}) to {out}"
    )
    return 0


def _check_startable(settings: ServeSettings) -> None:
    """Fail before the server starts, with one line, on what would otherwise be a startup traceback."""
    from cache_server.capture.model_dir import check_model_dir
    from cache_server.coordination.database import database_url
    from cache_server.torch_utils import resolve_device

    if settings.db:
        database_url(settings.db)  # a scheme it cannot open
    elif settings.store.startswith("s3://"):
        raise ValueError("--db is required with an s3:// store (the coordination database cannot live in a bucket)")
    check_model_dir(settings.model)
    resolve_device(settings.device)


def _serve(settings: ServeSettings) -> int:
    import uvicorn

    from cache_server.api.app import build_service, create_app
    from cache_server.api.http_protocol import JsonErrorHttpProtocol
    from cache_server.generation.engine import EngineUnfit
    from cache_server.store.errors import StoreInputError

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # before the port opens: an engine that cannot generate this target's responses stops the start
        service = build_service(settings)
    except (EngineUnfit, StoreInputError, FileNotFoundError) as e:  # a checkpoint without safetensors heads, say
        print(f"cache-server: {e}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings, build=lambda _: service),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="auto",  # uvloop when installed: it serves large bodies ~2x faster than asyncio
        http=JsonErrorHttpProtocol,  # httptools (h11 copies every response body once more), JSON 400s
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
