"""uvicorn's httptools protocol, answering what its HTTP parser rejects with the API's JSON error body.

The parser refuses a request line of about 64 KiB or more (measured: 65,000 bytes pass, 70,000 do
not); uvicorn would answer that with a plain-text 400. A long `layers=` list of a GET is where users
meet the limit, so the answer is `{"error": {"code": "bad_http_request", ...}}` like every other.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from schemas.errors import ErrorBody, ErrorCode, ErrorDetail

REQUEST_LINE_LIMIT_NOTE = "the request line (path and query) must stay under about 64 KiB"


class JsonErrorHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose parser-level 400 carries a JSON error body."""

    def send_400_response(self, msg: str) -> None:
        """Write a 400 with the API's error body and close the connection."""
        detail = ErrorDetail(code=ErrorCode.bad_http_request, message=f"{msg} ({REQUEST_LINE_LIMIT_NOTE})")
        body = json.dumps(ErrorBody(error=detail).model_dump()).encode()
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()
