"""What the fuzz tier (tests/fuzz) found, pinned in the ordinary test run: one test per finding."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from tests.fakes import FakeEngine
from tests.server_harness import RunningServer, read_response

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(), max_body_bytes=1024)
    yield running
    running.stop()


def post(srv: RunningServer, path: str, body: bytes) -> tuple[int, bytes]:
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
        )
        status, _, payload = read_response(f)
    return status, payload


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_body_too_large_for_the_messages_api_gets_anthropics_envelope(
    srv: RunningServer, path: str
) -> None:
    """The HTTP layer's own rejections (here 413, before any route runs) under /v1/messages are
    in Anthropic's envelope, as the routes' errors there are; found with a deeply nested body."""
    nested = b'{"a":' * 1000 + b"1" + b"}" * 1000
    status, payload = post(srv, path, b'{"max_tokens": 1, "model": %s}' % nested)
    assert status == 413
    assert orjson.loads(payload) == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "Request body exceeds 1024 bytes."},
    }
    status, payload = post(srv, "/v1/chat/completions", b'{"model": %s}' % nested)  # OpenAI's elsewhere
    assert status == 413 and orjson.loads(payload)["error"]["code"] == "request_too_large"
