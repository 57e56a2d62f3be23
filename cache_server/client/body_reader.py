"""Large response bodies read with `http.client` straight into one preallocated buffer.

httpx hands a body over in small pieces, each through its HTTP parser: on a 105 MB `/hidden`
body that costs about 3x a `readinto` into one buffer (bench/serve_hidden.py). One keep-alive
connection per thread.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import numpy as np

from cache_server.client.errors import ProtocolError, raise_for_error

# A kept-alive connection the server has since closed fails on first use: reconnect once.
_STALE = (http.client.RemoteDisconnected, http.client.ImproperConnectionState, BrokenPipeError, ConnectionResetError)


def _fresh(size: int) -> np.ndarray:
    return np.empty(size, dtype=np.uint8)  # not zero-filled; large ones get huge pages


class Scratch:
    """A per-thread receive buffer reused across bodies that are decoded and then dropped: a fresh
    buffer per 100 MB body costs ~40 ms of page faults taken inside the socket read (bench/serve_hidden.py)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self, size: int) -> np.ndarray:
        """This thread's buffer, grown to at least `size`; its first `size` bytes."""
        buf: np.ndarray | None = getattr(self._local, "buf", None)
        if buf is None or buf.nbytes < size:
            buf = np.empty(size, dtype=np.uint8)
            self._local.buf = buf
        return buf[:size]


class BodyTruncated(Exception):
    """The connection ended before Content-Length bytes arrived."""


@dataclass(frozen=True)
class Body:
    """A response: status, headers, and the body in one buffer."""

    status: int
    headers: list[tuple[str, str]]
    data: np.ndarray | bytes  # uint8 [Content-Length] on success; the raw error body otherwise


class BodyReader:
    """GETs with a kept-alive `http.client` connection per thread, bodies read into one buffer."""

    def __init__(self, base_url: str, *, timeout: float, headers: Mapping[str, str]) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server URL {base_url!r} must be http:// or https://host[:port]")
        self.base_url = base_url.rstrip("/")
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname, url.port
        self._prefix = url.path.rstrip("/")
        self._timeout = timeout
        self._headers = dict(headers)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self._timeout)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def get(
        self, path: str, params: Mapping[str, object] | None = None, *, into: Callable[[int], np.ndarray] | None = None
    ) -> Body:
        """The response; a successful body lands in `into(Content-Length)` (a uint8 buffer of exactly that
        size), else in a fresh one. Raises OSError / http.client.HTTPException if no response came,
        BodyTruncated if it broke off."""
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        try:
            return self._get(target, path, into or _fresh)
        except BaseException:
            self._drop()  # a connection left mid-request cannot send the next one
            raise

    def _get(self, target: str, path: str, into: Callable[[int], np.ndarray]) -> Body:
        try:
            response = self._send(self._connection(), target)
        except _STALE:
            self._drop()
            response = self._send(self._connection(), target)
        headers = response.getheaders()
        size = response.length
        if not 200 <= response.status < 300 or size is None:
            return Body(response.status, headers, response.read())
        data = into(size)
        view, pos = memoryview(data.data), 0
        while pos < size:
            n = response.readinto(view[pos:])
            if not n:
                raise BodyTruncated(f"body of {path} ended at {pos} of {size} bytes")
            pos += n
        return Body(response.status, headers, data)

    def _drop(self) -> None:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._all.remove(conn)

    def _send(self, conn: http.client.HTTPConnection, target: str) -> http.client.HTTPResponse:
        conn.request("GET", target, headers=self._headers)
        return conn.getresponse()

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()


def httpx_body(http: httpx.Client, path: str, params: dict[str, Any] | None) -> tuple[np.ndarray | bytes, str]:
    """A tensor body through httpx (when tests pass in a transport), into one buffer sized from
    Content-Length, and its content type; the typed error of an error response."""
    with http.stream("GET", path, params=params) as response:
        if not response.is_success:
            response.read()
            raise_for_error(response)
        content_type = response.headers.get("content-type", "")
        size = int(response.headers.get("Content-Length", "-1"))
        if size < 0:
            return response.read(), content_type
        buf = np.empty(size, dtype=np.uint8)
        view, pos = memoryview(buf.data), 0
        for chunk in response.iter_raw():
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        if pos != size:
            raise ProtocolError(f"body of {path} ended at {pos} of {size} bytes")
        return buf, content_type
