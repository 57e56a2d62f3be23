"""A store that may not be written: a tmpfs remounted read-only under `cache-server serve` (found by
its write probe), and a writable one served with `--read-only`. Either starts, serves its published
prompts bit-identical, refuses registrations and captures (403 `store_read_only`) and writes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cache_server.api.app import build_service, create_app
from cache_server.client import CacheClient, NotReadyError, StoreReadOnlyError
from cache_server.coordination.captures import CaptureQueue
from cache_server.coordination.database import Database
from cache_server.store.errors import StoreInputError
from testing.servers import running_server, serving_app
from tests.cache_server.helpers import serve_settings
from tests.cache_server.small_disk import files_under, remount, small_disk

PROMPTS = [{"token_ids": [5, 6, 7, 8, 9]}, {"token_ids": list(range(3, 200))}]
Stored = dict[str, tuple[np.ndarray, np.ndarray]]  # prompt id -> (hidden of layers 0 and 1, token ids)


@pytest.fixture
def small(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path | None]:
    with small_disk(request, tmp_path / "small", "1m") as mount:
        yield mount


def _capture(model: Path, store: Path, db: Path) -> Stored:
    """Prompts captured by a server that may write the store (layers 0 and 1 only)."""
    settings = serve_settings(model, store, db=str(db), capture_layers="0,1")
    with serving_app(create_app(settings)) as url, CacheClient(url, timeout=60) as client:
        ids = [p.prompt_id for p in client.register(PROMPTS)]
        client.wait_ready(ids, timeout_s=60)
        return {pid: ((r := client.hidden(pid, [0, 1])).hidden.copy(), r.token_ids.copy()) for pid in ids}


def _check_read_only(client: CacheClient, stored: Stored) -> None:
    for pid, (hidden, token_ids) in stored.items():
        got = client.hidden(pid, [0, 1], encoding="safetensors")
        assert got.hidden.tobytes() == hidden.tobytes() and np.array_equal(got.token_ids, token_ids)
        assert client.prompt(pid).status == "ready"
    with pytest.raises(StoreReadOnlyError) as refused:
        client.register([{"token_ids": [11, 12, 13]}])
    assert (refused.value.status, refused.value.code) == (403, "store_read_only")
    assert "read-only" in refused.value.message
    assert {p.prompt_id for p in client.prompts()} == set(stored)  # nothing registered
    with pytest.raises(StoreReadOnlyError):  # a layer not captured yet
        client.hidden(next(iter(stored)), [2])


def _listing(store: Path) -> list[tuple[str, int, int]]:
    """Every file and directory (the store's root too) with its size and modification time."""
    paths = [store, *store.rglob("*")]
    return sorted((str(p.relative_to(store)), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)


def test_a_read_only_mount_is_served_and_never_written(tiny_target: Path, small: Path | None, tmp_path: Path) -> None:
    if small is None:
        return  # it ran, and passed, in a mount namespace of its own
    db = tmp_path / "db.sqlite"  # the coordination database the store's writers share, off the store
    stored = _capture(tiny_target, small, db)
    remount(small, "ro")
    before = _listing(small)

    with pytest.raises(StoreInputError, match="pass --db"):  # its default database would live in the store
        build_service(serve_settings(tiny_target, small))
    with (
        running_server(tiny_target, small, "--db", str(db), "--capture-layers", "0,1") as url,
        CacheClient(url, timeout=60) as client,
    ):
        _check_read_only(client, stored)
        # Work a writer queued is left to it: this server claims nothing (it would fail it).
        captures = CaptureQueue(Database(str(db)), client.model().fingerprint, "a-writer")
        captures.request_many({"queued-by-a-writer": [0]})
        time.sleep(1.5)  # several polls of the server's compute loop
        state = captures.state("queued-by-a-writer")
        assert state is not None and state.status == "queued"
        captures.db.close()
    assert _listing(small) == before
    assert "is read-only (Read-only file system)" in (tmp_path / "small.log").read_text()


def test_read_only_serves_a_writable_store_without_writing_it(tiny_target: Path, tmp_path: Path) -> None:
    store, db = tmp_path / "store", tmp_path / "db.sqlite"
    stored = _capture(tiny_target, store, db)
    before = _listing(store)
    settings = serve_settings(tiny_target, store, db=str(db), capture_layers="0,1", read_only=True)
    with serving_app(create_app(settings)) as url, CacheClient(url, timeout=60) as client:
        _check_read_only(client, stored)
        assert _listing(store) == before
        # Bit rot it cannot mend: refused, with no promise of a capture (no Retry-After), nothing written.
        rotten = next(iter(stored))
        chunk = next(p for p in store.rglob(f"prompts/{rotten}/layers/1/c/*/*") if p.is_file())
        chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 1]))
        before = _listing(store)
        with pytest.raises(NotReadyError, match="does not match its checksum; not served") as refused:
            client.hidden(rotten, [0, 1])
        assert refused.value.retry_after_s is None
    assert _listing(store) == before  # not even a write probe: the root's modification time is the same
    assert files_under(store)  # still all there
