"""Client edge cases with httpx.MockTransport: error bodies become typed exceptions."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from cache_server.client import (
    ApiError,
    CacheClient,
    InvalidRequestError,
    NotFoundError,
    NotReadyError,
    PromptFailedError,
    ProtocolError,
)
from schemas.safetensors_frame import TensorSpec, frame
from tests.cache_server.helpers import error_response


def _client(handler) -> CacheClient:  # type: ignore[no-untyped-def]
    return CacheClient("http://test", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("response", "exc"),
    [
        (error_response(422, "invalid_layers"), InvalidRequestError),
        (error_response(404, "prompt_not_found"), NotFoundError),
        (error_response(409, "prompt_failed"), PromptFailedError),
        (error_response(500, "internal_error"), ApiError),
        (error_response(418, "a_code_from_a_newer_server"), ApiError),
        (httpx.Response(502, text="<html>bad gateway</html>"), ProtocolError),
    ],
)
def test_error_bodies_become_typed_exceptions(response: httpx.Response, exc: type[Exception]) -> None:
    with _client(lambda _: response) as client, pytest.raises(exc):
        client.hidden("p", [1])


def test_not_ready_carries_retry_after() -> None:
    client = _client(lambda _: error_response(503, "prompt_not_ready", {"Retry-After": "7"}))
    with client, pytest.raises(NotReadyError) as info:
        client.hidden("p", [1])
    assert info.value.retry_after_s == 7


def _body(layers: str, width: int) -> bytes:
    fields = dict(prompt_id="p", layers=layers, layer_convention="decoder_output_0based", model_fingerprint="f")
    meta = {**fields, "hidden_size": "4", "prompt_len": "1", "start": "0", "stop": "2", "dtype": "float32"}
    specs = [TensorSpec("hidden", np.dtype(np.float32), (2, width)), TensorSpec("token_ids", np.dtype(np.int64), (2,))]
    body = frame(specs, meta)
    body.buffer[-(2 * width * 4 + 16) :] = 0
    return body.buffer.tobytes()


def _stream(data: bytes) -> httpx.Response:
    return httpx.Response(200, stream=httpx.ByteStream(data), headers={"Content-Length": str(len(data))})


def test_a_body_with_other_layers_than_asked_is_refused() -> None:
    with _client(lambda _: _stream(_body("1,2", 8))) as client:
        assert client.hidden("p", [1, 2]).hidden.shape == (2, 8)
        with pytest.raises(ProtocolError, match=r"asked for layers \[2, 1\]"):
            client.hidden("p", [2, 1])


def test_truncated_body_is_a_protocol_error() -> None:
    data = _body("1,2", 8)
    response = httpx.Response(200, stream=httpx.ByteStream(data[:-5]), headers={"Content-Length": str(len(data))})
    with _client(lambda _: response) as client, pytest.raises(ProtocolError):
        client.hidden("p", [1, 2])
