"""A capture whose write fills the store (ENOSPC, on a 512 KiB tmpfs): that prompt fails as
`storage_exceeded` where a failed capture shows, nothing of its write is left, a published prompt keeps
the layers it had, the next prompt that fits is captured, and the failed one waits for a registration."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cache_server.api.app import build_service, create_app
from cache_server.client import CacheClient, InvalidRequestError
from cache_server.compute.service import HiddenStateService
from cache_server.settings import ServeSettings
from testing.servers import serving_app
from tests.cache_server.helpers import serve_settings
from tests.cache_server.small_disk import files_under, free_bytes, small_disk

LEFT_FREE = 60 * 1024  # after the filler: a 10-token prompt fits (~24 KB), a 500-token layer does not


class _Gated:
    """The real service, its target's captures held at `gate` (open unless a test closes it)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, settings: ServeSettings) -> HiddenStateService:
        service = build_service(settings)
        capture, gate = service.target.capturer.capture, self.gate

        def gated_capture(*args: Any, **kwargs: Any) -> Any:
            gate.wait(timeout=60)
            return capture(*args, **kwargs)

        service.target.capturer.capture = gated_capture  # type: ignore[method-assign]
        return service


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 500, n)]


@pytest.fixture
def small(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path | None]:
    with small_disk(request, tmp_path / "small", "512k") as mount:
        yield mount


def test_a_capture_that_fills_the_store_fails_as_storage_exceeded_and_leaves_nothing(
    tiny_target: Path, small: Path | None, tmp_path: Path
) -> None:
    if small is None:
        return  # it ran, and passed, in a mount namespace of its own
    store, gated = small / "store", _Gated()
    settings = serve_settings(tiny_target, store, db=str(tmp_path / "db.sqlite"), capture_layers="0", wait_s=20)
    with serving_app(create_app(settings, build=gated)) as url, CacheClient(url, timeout=60) as client:
        [a] = client.register([{"token_ids": _tokens(500, 1)}])
        client.wait_ready([a.prompt_id], timeout_s=60)
        before = client.hidden(a.prompt_id, [0]).hidden.copy()
        prompts = store / client.model().fingerprint / "prompts"

        gated.gate.clear()  # registered while there is room; the disk fills before its capture writes
        [b] = client.register([{"token_ids": _tokens(600, 2), "sets": ["s"]}])
        (small / "filler").write_bytes(b"\0" * (free_bytes(small) - LEFT_FREE))
        free_then = free_bytes(small)
        gated.gate.set()

        with pytest.raises(InvalidRequestError) as failed:
            client.hidden(b.prompt_id, [0])
        assert (failed.value.status, failed.value.code) == (422, "storage_exceeded")
        assert "ran out of space" in failed.value.message and "No space left on device" in failed.value.message
        state = client.prompt(b.prompt_id)
        assert state.status == "failed" and (state.error or "").startswith("storage_exceeded: ")
        [counts] = client.sets().sets
        assert (counts.failed, counts.ready) == (1, 0)
        assert files_under(prompts / b.prompt_id) == []  # no chunk, no zarr.json, no .tmp, no manifest
        assert free_bytes(small) >= free_then - 4096  # what it wrote was given back

        # A published prompt asked for a layer that does not fit: that capture fails, its layers stay.
        with pytest.raises(InvalidRequestError, match="storage_exceeded"):
            client.hidden(a.prompt_id, [0, 3])
        assert not [f for f in files_under(prompts / a.prompt_id) if f.startswith("layers/3/")]
        assert client.prompt(a.prompt_id).layers_stored == [0]
        np.testing.assert_array_equal(client.hidden(a.prompt_id, [0]).hidden, before)
        assert not [f for f in files_under(store) if f.endswith(".tmp")]

        [c] = client.register([{"token_ids": _tokens(10, 3)}])  # fits in what is left
        client.wait_ready([c.prompt_id], timeout_s=60)
        assert client.prompt(b.prompt_id).status == "failed"  # not retried by itself

        (small / "filler").unlink()
        assert client.register([{"token_ids": _tokens(600, 2)}])[0].prompt_id == b.prompt_id  # asks again
        client.wait_ready([b.prompt_id], timeout_s=60)
        assert client.hidden(b.prompt_id, [0]).hidden.shape == (600, 64)
        # Registering the published prompt again asks again for the layer whose capture failed.
        assert client.register([{"token_ids": _tokens(500, 1)}])[0].prompt_id == a.prompt_id
        both = client.hidden(a.prompt_id, [0, 3]).hidden
        np.testing.assert_array_equal(both[:, :64], before)
        assert client.prompt(a.prompt_id).layers_stored == [0, 3]
