"""Optional bearer token on write endpoints (`--token`); reads stay open."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, Request

from cache_server.errors import Unauthorized


def require_token(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """Raise Unauthorized unless the server has no token or the request carries `Bearer <token>`."""
    token: str | None = request.app.state.token
    if token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Unauthorized("this endpoint needs 'Authorization: Bearer <token>' (the server's --token)")
    if not secrets.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("the bearer token is not this server's --token")


WriteAccess = Depends(require_token)
