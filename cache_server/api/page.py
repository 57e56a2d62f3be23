"""`GET /`: the leaderboard page, one self-contained HTML file (no CDN: nodes are often offline) that
reads only the JSON endpoints (`/model`, `/sets`, `/jobs`, `/jobs/reports`) and refreshes itself."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

page_router = APIRouter(tags=["page"])
_PAGE = Path(__file__).with_name("static") / "leaderboard.html"


@cache
def _html() -> str:
    return _PAGE.read_text(encoding="utf-8")


@page_router.get("/", response_class=HTMLResponse, include_in_schema=False)
def leaderboard() -> HTMLResponse:
    """The leaderboard: target, sets, jobs, tau per checkpoint (per set, sortable), tau vs step, and the
    per-position acceptance curve of a chosen checkpoint."""
    return HTMLResponse(_html())
