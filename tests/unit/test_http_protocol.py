"""Byte-level tests of zinc.server.http11 with a mock transport: no sockets, real h11 and timers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from tests.fakes import MockTransport, ParsedResponse, async_test, parse_responses
from zinc.server.config import ServerConfig
from zinc.server.exchange import Exchange, HttpRequest
from zinc.server.http11 import HttpProtocol

GET = b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n"


def post(body: bytes, path: str = "/echo", extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra)
    return head + body


class App:
    """A test handler: /echo reads and echoes the body; other paths exercise one behaviour each."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.cancelled: list[str] = []
        self.seen: list[str] = []

    async def __call__(self, request: HttpRequest, exchange: Exchange) -> None:
        self.seen.append(request.path)
        try:
            await self._route(request, exchange)
        except asyncio.CancelledError:
            self.cancelled.append(request.path)
            raise

    async def _route(self, request: HttpRequest, exchange: Exchange) -> None:
        if request.path == "/noread":
            await exchange.respond_json(200, b'{"ok":true}')
        elif request.path == "/wait":
            await self.gate.wait()
            await exchange.respond_json(200, b'{"waited":true}')
        elif request.path == "/stream":
            await exchange.start_stream(200, [("content-type", "text/event-stream")])
            for i in range(3):
                await exchange.send(b"data: %d\n\n" % i)
                await asyncio.sleep(0.03)
            await exchange.end()
        elif request.path == "/gated-stream":
            await exchange.start_stream(200, [("content-type", "text/event-stream")])
            await exchange.send(b"data: first\n\n")
            await self.gate.wait()
            await exchange.send(b"data: second\n\n")
            await exchange.end()
        elif request.path == "/boom":
            raise RuntimeError("secret internal detail")
        else:
            body = await exchange.body()
            doc = {
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "body": body.decode(),
            }
            await exchange.respond_json(200, orjson.dumps(doc))


class Conn:
    """One protocol instance wired to a mock transport."""

    def __init__(self, app: Any = None, **limits: Any) -> None:
        self.app = app or App()
        self.config = ServerConfig(**limits)
        self.protocol = HttpProtocol(self.app, self.config, [("access-control-allow-origin", "*")])
        self.transport = MockTransport()
        self.transport.protocol = self.protocol
        self.protocol.connection_made(self.transport)

    def feed(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def settle(self, seconds: float = 0.0) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        if seconds:
            await asyncio.sleep(seconds)

    async def responses(self, seconds: float = 0.0) -> list[ParsedResponse]:
        await self.settle(seconds)
        return parse_responses(self.transport.take())


@async_test
async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    conn = Conn()
    for i in range(3):
        conn.feed(post(b"n%d" % i))
        (response,) = await conn.responses()
        assert response.status == 200
        assert response.json()["body"] == f"n{i}"
        assert "close" not in response.headers.get("connection", "")
        assert response.headers["access-control-allow-origin"] == "*"
    assert not conn.transport.closed


@async_test
async def test_http10_is_answered_then_closed() -> None:
    conn = Conn()
    conn.feed(b"GET /echo HTTP/1.0\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 200 and response.headers["connection"] == "close"
    assert conn.transport.closed


@async_test
async def test_http10_stream_is_unframed_and_closed() -> None:
    conn = Conn()
    conn.feed(b"GET /stream HTTP/1.0\r\n\r\n")
    (response,) = await conn.responses(0.15)
    assert "transfer-encoding" not in response.headers and response.headers["connection"] == "close"
    assert response.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and conn.transport.closed


@async_test
async def test_connection_close_header_closes_after_response() -> None:
    conn = Conn()
    conn.feed(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 200 and conn.transport.closed


@async_test
async def test_pipelined_requests_are_answered_in_order() -> None:
    app = App()
    conn = Conn(app)
    conn.feed(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n" + post(b"second") + GET)
    await conn.settle()
    assert conn.transport.read_paused  # h11 PAUSED: the next request waits for this response
    assert conn.transport.take() == b""
    app.gate.set()
    responses = await conn.responses()
    assert [r.json().get("waited", r.json().get("body")) for r in responses] == [True, "second", ""]
    assert not conn.transport.read_paused and not conn.transport.closed


@async_test
async def test_chunked_request_body_is_reassembled() -> None:
    conn = Conn()
    conn.feed(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    await conn.settle()
    conn.feed(b"6\r\n world\r\n0\r\n\r\n")
    (response,) = await conn.responses()
    assert response.json()["body"] == "hello world"


@async_test
async def test_expect_100_continue_is_sent_when_the_body_is_read() -> None:
    conn = Conn()
    conn.feed(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    await conn.settle()
    assert conn.transport.take().startswith(b"HTTP/1.1 100 ")
    conn.feed(b"body")
    (response,) = await conn.responses()
    assert response.json()["body"] == "body" and not conn.transport.closed


@async_test
async def test_too_large_declared_body_gets_413_instead_of_100() -> None:
    conn = Conn(max_body_bytes=10)
    conn.feed(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert conn.transport.closed


@async_test
async def test_chunked_body_past_the_limit_gets_413() -> None:
    conn = Conn(max_body_bytes=10)
    conn.feed(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n")
    await conn.settle()  # the handler is reading the body
    conn.feed(b"8\r\n12345678\r\n")
    (response,) = await conn.responses()
    assert response.status == 413 and conn.transport.closed
    assert conn.app.cancelled == ["/echo"]


@pytest.mark.parametrize("split", [True, False])
@async_test
async def test_headers_past_the_limit_get_431(split: bool) -> None:
    conn = Conn(max_header_bytes=1024)
    head = b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 2000
    if split:  # never completes: h11's incomplete-event limit
        conn.feed(head)
    else:  # complete in one read, still too large
        conn.feed(head + b"\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 431 and conn.transport.closed
    assert response.json()["error"]["type"] == "invalid_request_error"


@async_test
async def test_malformed_request_gets_400_envelope() -> None:
    conn = Conn()
    conn.feed(b"NOT HTTP AT ALL\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 400 and conn.transport.closed
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("partial", [b"GET /echo HTTP/1.1\r\nHost:", post(b"0123456789")[:-4]])
@async_test
async def test_request_not_received_in_time_gets_408(partial: bytes) -> None:
    conn = Conn(request_timeout_s=0.2)
    conn.feed(partial)
    await conn.settle(0.05)
    assert not conn.transport.closed
    (response,) = await conn.responses(0.3)
    assert response.status == 408 and conn.transport.closed


@async_test
async def test_idle_keep_alive_connection_is_closed() -> None:
    conn = Conn(keep_alive_timeout_s=0.2)
    conn.feed(GET)
    await conn.responses()
    assert not conn.transport.closed
    await conn.settle(0.3)
    assert conn.transport.closed


@async_test
async def test_new_connection_that_sends_nothing_is_closed() -> None:
    conn = Conn(keep_alive_timeout_s=0.05)
    await conn.settle(0.1)
    assert conn.transport.closed


@async_test
async def test_no_timeout_while_a_response_streams() -> None:
    conn = Conn(request_timeout_s=0.02, keep_alive_timeout_s=0.02)
    conn.feed(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    (response,) = await conn.responses(0.2)
    assert response.chunked and response.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


@async_test
async def test_a_streamed_answer_to_head_sends_no_body() -> None:
    conn = Conn()
    conn.feed(b"HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    await conn.settle(0.2)
    written = conn.transport.take()
    assert written.startswith(b"HTTP/1.1 200 ")
    assert written.endswith(b"\r\n\r\n") and b"data:" not in written  # the head only, never a chunk


@async_test
async def test_disconnect_cancels_the_handler() -> None:
    app = App()
    conn = Conn(app)
    conn.feed(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    await conn.settle()
    conn.protocol.connection_lost(ConnectionResetError())
    await conn.settle()
    assert app.cancelled == ["/wait"]


@async_test
async def test_eof_counts_as_disconnect() -> None:
    app = App()
    conn = Conn(app)
    conn.feed(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    await conn.settle()
    assert not conn.protocol.eof_received()  # falsy: asyncio closes the transport
    conn.protocol.connection_lost(None)
    await conn.settle()
    assert app.cancelled == ["/wait"]


@async_test
async def test_stream_writer_waits_while_the_transport_is_write_paused() -> None:
    app = App()
    conn = Conn(app)
    conn.feed(b"GET /gated-stream HTTP/1.1\r\nHost: t\r\n\r\n")
    await conn.settle()
    conn.protocol.pause_writing()
    app.gate.set()
    await conn.settle(0.02)
    assert b"second" not in conn.transport.written
    conn.protocol.resume_writing()
    await conn.settle()
    assert b"data: second" in conn.transport.written


@async_test
async def test_unread_body_past_the_high_water_mark_pauses_reading() -> None:
    app = App()
    conn = Conn(app, body_high_water_bytes=16)
    conn.feed(b"POST /wait HTTP/1.1\r\nHost: t\r\nContent-Length: 64\r\n\r\n" + b"x" * 32)
    await conn.settle()
    assert conn.transport.read_paused
    app.gate.set()  # responds without reading: the rest of the body is drained, then keep-alive
    await conn.settle()
    assert not conn.transport.read_paused
    conn.feed(b"y" * 32 + GET)
    responses = await conn.responses()
    assert [r.status for r in responses] == [200, 200] and not conn.transport.closed


@async_test
async def test_reading_the_body_resumes_reading() -> None:
    conn = Conn(body_high_water_bytes=16)
    conn.feed(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 64\r\n\r\n" + b"x" * 32)
    await conn.settle()
    assert conn.transport.pause_count >= 1 and not conn.transport.read_paused
    conn.feed(b"x" * 32)
    (response,) = await conn.responses()
    assert len(response.json()["body"]) == 64


@async_test
async def test_response_before_100_continue_closes_the_connection() -> None:
    conn = Conn()
    conn.feed(b"POST /noread HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    (response,) = await conn.responses()
    assert response.status == 200 and response.headers["connection"] == "close"
    assert conn.transport.closed


@async_test
async def test_handler_exception_becomes_generic_500(caplog: pytest.LogCaptureFixture) -> None:
    conn = Conn()
    with caplog.at_level(logging.INFO, logger="zinc.server"):
        conn.feed(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n")
        (response,) = await conn.responses()
    assert response.status == 500
    assert b"secret" not in response.body and b"Traceback" not in response.body
    assert response.json()["error"]["type"] == "server_error"
    assert any(r.exc_info for r in caplog.records)  # the traceback goes to the log
    access = [r for r in caplog.records if r.name == "zinc.server.access"]
    assert access and access[0].getMessage().startswith("GET /boom 500") and not access[0].exc_info


@async_test
async def test_shutdown_closes_idle_and_finishes_busy_connections() -> None:
    idle = Conn()
    idle.protocol.shutdown()
    assert idle.transport.closed
    app = App()
    busy = Conn(app)
    busy.feed(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    await busy.settle()
    busy.protocol.shutdown()
    assert not busy.transport.closed
    app.gate.set()
    (response,) = await busy.responses()
    assert response.status == 200 and response.headers["connection"] == "close"
    assert busy.transport.closed


@async_test
async def test_query_string_is_split_from_the_path() -> None:
    conn = Conn()
    conn.feed(b"GET /echo?a=1&b=2 HTTP/1.1\r\nHost: t\r\n\r\n")
    (response,) = await conn.responses()
    assert response.json()["path"] == "/echo" and response.json()["query"] == "a=1&b=2"
