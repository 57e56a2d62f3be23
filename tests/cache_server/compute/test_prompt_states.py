"""`GET /sets`' pending prompts split by where they are: queued (no server has taken them up), generating
(their responses being made) and capturing (tokens known), from the shared capture table."""

from __future__ import annotations

from pathlib import Path

from cache_server.api.app import build_service
from cache_server.coordination.captures import CaptureQueue
from schemas.prompts import GenerateSpec, PromptSpec
from tests.cache_server.helpers import serve_settings


def test_pending_prompts_are_counted_by_where_they_are(tiny_target: Path, tmp_path: Path) -> None:
    service = build_service(serve_settings(tiny_target, tmp_path / "store"))  # not started: nothing is claimed
    try:
        given = PromptSpec(token_ids=[5, 6, 7], response_token_ids=[8, 9], sets=["s"])
        service.register([given], None)
        service.register(
            [PromptSpec(token_ids=[p, 6, 7], sets=["s"]) for p in (10, 11, 12)], GenerateSpec(max_new_tokens=4)
        )
        [counts] = service.prompts.set_counts().sets
        assert (counts.pending, counts.queued, counts.generating, counts.capturing) == (4, 4, 0, 0)
        other = CaptureQueue(service.db, service.store.namespace, "another-server")
        for _ in range(3):  # the oldest first: the given response, then two to generate
            assert other.claim() is not None
        [counts] = service.prompts.set_counts().sets
        assert (counts.pending, counts.queued, counts.generating, counts.capturing) == (4, 1, 2, 1)
    finally:
        service.close()
