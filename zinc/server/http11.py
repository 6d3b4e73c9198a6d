"""HTTP/1.1 over asyncio: one `HttpProtocol` per connection around a sans-IO `h11.Connection`.

Owns the byte-level rules: keep-alive (HTTP/1.1 without `Connection: close`), HTTP/1.0 answered
then closed, pipelined requests answered in order (h11's PAUSED pauses reading), chunked request
bodies, `Expect: 100-continue` (413 instead of 100 when the declared body is too large), the named
limits (431 headers, 413 body, 408 request not received in time, keep-alive idle timeout), read
back-pressure (pause past a body high-water mark), writes (held to the loop's next turn, so the
streams of one decode step go out back to back; a chunked response's body chunks framed here,
h11's head and last chunk around them) and write back-pressure (`drain()` waits while the
transport is write-paused), and disconnects: `connection_lost` cancels the handler task, which
is how a client that goes away aborts its generation. There is no read timeout while a response
is being produced, but a client that stops reading one (the transport stays write-paused with no
byte taken for `write_timeout_s`; looked at each time that passes, so the drop comes one to two of
them after the last byte taken) is dropped, which cancels its handler the same way. Past
`max_connections` open connections a new one is answered 503 with `Retry-After` at once, without
reading its request, and closed. Each request is handed to a `Handler` coroutine with an `Exchange`.
Strict framing (request smuggling): besides what h11 rejects, a request head with a bare CR or LF,
obs-fold or a control character, Content-Length together with Transfer-Encoding, a chunk size
that does not fit in 64 bits, and request trailer fields are answered 400 and the connection
closed; chunk extensions are ignored (RFC 9112 7.1.1). An HTTP version other than 1.x (an HTTP/2
preface, `HTTP/0.9`) gets 505.
A request rejected here after its head was read is answered in Anthropic's error envelope under
/v1/messages (as the routes answer there), in OpenAI's elsewhere.
Policy: a response that ends before the body was read drains the rest of the body (or closes, if
the client still waits for 100-continue); EOF from the client counts as a disconnect.
Imports: h11, orjson, asyncio, the stdlib, zinc.server.{anthropic_response, config, error_table,
exchange}.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import cast

import h11
import orjson

from zinc.server.anthropic_response import error_body, is_anthropic_path
from zinc.server.config import ServerConfig
from zinc.server.error_table import (
    BadHttpRequestError,
    HeadersTooLargeError,
    HttpVersionNotSupportedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
    error_json,
)
from zinc.server.exchange import Exchange, Headers, HttpRequest

Handler = Callable[[HttpRequest, Exchange], Awaitable[None]]

access_log = logging.getLogger("zinc.server.access")
log = logging.getLogger("zinc.server")

_READ_PAUSED_FOR_PIPELINE = "pipeline"
_READ_PAUSED_FOR_BODY = "body"
_REFUSED_LINGER_S = 1.0  # a refused connection reads and drops its request this long, then closes
_MAX_CHUNK_SIZE = 2**64 - 1  # a chunk size past this overflows other parsers' integers: 400
_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a request head (it accepts bare LF)
# In a request head: a control character, a bare CR, a bare LF, or obs-fold (a line that starts
# with whitespace). h11 unfolds obs-fold, accepts bare LF and lets \x01-\x1f and \x7f through.
_BAD_HEAD = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n|\n[ \t]")


class HttpProtocol(asyncio.Protocol):
    """One client connection: bytes in, events to the handler, responses out."""

    def __init__(
        self,
        handler: Handler,
        config: ServerConfig,
        common_headers: Headers = (),
        registry: set[HttpProtocol] | None = None,
    ) -> None:
        self._handler = handler
        self._config = config
        self._common_headers = [(k.encode(), v.encode()) for k, v in common_headers]
        self._registry = registry
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=config.max_header_bytes)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._exchange: Exchange | None = None
        self._keep_alive = True  # False once shutting down: finish this response, then close
        self._closing = False
        self._closed_by_us = False
        self._dropped_as = "cancelled"  # the access log's word for a response we cut off
        self._read_paused: set[str] = set()
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._request_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_backlog = 0  # bytes the transport held when the write timer was last armed
        self._head_checked = False  # the request head in h11's buffer passed `_check_head`
        self._out: list[bytes] = []  # bytes for the transport, written at the loop's next turn
        self._chunked = False  # the response in progress is in chunked transfer-coding (h11 chose it)

    # ---- asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._registry is not None:
            if len(self._registry) >= self._config.max_connections:
                self._refuse()
                return
            self._registry.add(self)
        self._start_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._cancel_idle_timer()
        if self._request_timer is None and self._conn.their_state in (h11.IDLE, h11.SEND_BODY):
            self._start_request_timer()
        self._conn.receive_data(data)
        self._handle_events()

    def eof_received(self) -> bool | None:
        return None  # the client is gone: close, which cancels whatever it asked for

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._cancel_idle_timer()
        self._cancel_request_timer()
        self._cancel_write_timer()
        self._writable.set()  # wake a writer waiting for drain; its task is cancelled below
        if self._registry is not None:
            self._registry.discard(self)
        exchange, self._exchange = self._exchange, None
        if exchange is not None and not exchange.response_complete:
            self._log(exchange, self._dropped_as if self._closed_by_us else "client-disconnected")
        if exchange is not None and exchange.task is not None and not exchange.task.done():
            exchange.task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()
        self._arm_write_timer()

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        self._writable.set()

    # ---- server control (graceful shutdown)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._exchange.task if self._exchange is not None else None

    def shutdown(self) -> None:
        """Stop keep-alive: close now if idle, else after the response in progress."""
        self._keep_alive = False
        if self._exchange is None or self._exchange.response_complete:
            self._close()

    def abort(self) -> None:
        """Cancel the request in progress and drop the connection."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        self._close()

    # ---- incoming events

    def _handle_events(self) -> None:
        while not self._closing:
            if not self._head_checked and self._conn.their_state is h11.IDLE and not self._check_head():
                return
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                error = (
                    HeadersTooLargeError("Request headers are too large.")
                    if exc.error_status_hint == 431
                    else BadHttpRequestError(f"Malformed HTTP request: {exc}")
                )
                self._reject(error)
                return
            if self._conn.their_state is h11.SEND_BODY:
                # a chunk's size is checked at its first event: NEED_DATA, or Data with its start
                chunk = _chunk_left(self._conn) + (len(event.data) if isinstance(event, h11.Data) else 0)
                if chunk > _MAX_CHUNK_SIZE:
                    self._reject(BadHttpRequestError("Malformed HTTP request: chunk size overflows."))
                    return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:
                self._pause_reading(_READ_PAUSED_FOR_PIPELINE)
                return
            if isinstance(event, h11.Request):
                self._on_request(event)
            elif isinstance(event, h11.Data):
                self._on_body(event.data)
            elif isinstance(event, h11.EndOfMessage):
                if event.headers:
                    self._reject(BadHttpRequestError("Request trailer fields are not accepted."))
                    return
                self._on_body_end()
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _on_request(self, event: h11.Request) -> None:
        target = event.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers)
        request = HttpRequest(
            event.method.decode("ascii"), path, query, headers, event.http_version.decode("ascii")
        )
        exchange = Exchange(self, request)
        self._exchange = exchange
        if not event.http_version.startswith(b"1."):
            message = f"HTTP/{request.http_version} is not supported; this server speaks HTTP/1.1."
            self._reject(HttpVersionNotSupportedError(message))
            return
        if request.header("transfer-encoding") is not None and request.header("content-length") is not None:
            self._reject(BadHttpRequestError("Content-Length together with Transfer-Encoding."))
            return
        head_size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in headers)
        if head_size > self._config.max_header_bytes:
            self._reject(HeadersTooLargeError("Request headers are too large."))
            return
        declared = request.header("content-length")
        if declared is not None and int(declared) > self._config.max_body_bytes:
            self._reject(self._too_large())
            return
        exchange.task = self._loop.create_task(self._run(exchange))

    def _on_body(self, data: bytes) -> None:
        exchange = self._exchange
        assert exchange is not None
        exchange.received_bytes += len(data)
        if exchange.received_bytes > self._config.max_body_bytes:
            self._reject(self._too_large())
        elif not exchange.response_complete:  # else: drain a body the handler did not read
            exchange.feed(data)
            if exchange.buffered_bytes > self._config.body_high_water_bytes:
                self._pause_reading(_READ_PAUSED_FOR_BODY)

    def _on_body_end(self) -> None:
        self._cancel_request_timer()
        exchange = self._exchange
        assert exchange is not None
        exchange.feed_end()
        if exchange.response_complete:
            self._next_cycle()

    def _too_large(self) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"Request body exceeds {self._config.max_body_bytes} bytes.")

    async def _run(self, exchange: Exchange) -> None:
        try:
            await self._handler(exchange.request, exchange)
        except asyncio.CancelledError:
            return  # client gone, timed out, or shutdown: nothing more to send
        except Exception as exc:
            log.error("request handler failed", exc_info=exc)
            if not exchange.response_started:
                await exchange.respond_error(exc)
            else:
                self._close()
            return
        if not exchange.response_started:
            log.error("request handler returned without responding: %s", exchange.request.path)
            await exchange.respond_error(RuntimeError("no response"))
        elif not exchange.response_complete:
            await exchange.end()

    # ---- Connection protocol used by Exchange

    def send_continue(self) -> None:
        if self._conn.they_are_waiting_for_100_continue:
            self._send(h11.InformationalResponse(status_code=100, headers=[]))

    def send_head(self, status: int, headers: Headers) -> None:
        raw = [*self._common_headers, *((k.encode(), v.encode()) for k, v in headers)]
        if self._exchange is not None:
            raw.append((b"x-request-id", self._exchange.request_id.encode()))
        # Close rather than guess whether a client still waiting for 100-continue sends its body.
        if not self._keep_alive or self._conn.they_are_waiting_for_100_continue:
            raw.append((b"connection", b"close"))
        head = self._send(h11.Response(status_code=status, headers=raw, reason=_reason(status)))
        head_only = self._exchange is not None and self._exchange.request.method == "HEAD"  # no body
        self._chunked = not head_only and b"\r\ntransfer-encoding: chunked\r\n" in head.lower()

    def send_data(self, data: bytes) -> None:
        if not self._chunked:
            self._send(h11.Data(data=data))
        elif data and not self._closing:
            # A chunk as h11 frames it, without its per-event state machine: a streamed token's
            # SSE event paid about 15 us of the event loop's CPU for it. h11 still writes the head and the last chunk (EndOfMessage).
            self._write(b"%x\r\n%b\r\n" % (len(data), data))

    def send_end(self, exchange: Exchange) -> None:
        self._chunked = False
        self._send(h11.EndOfMessage())
        self._log(exchange, str(exchange.status))
        if exchange is not self._exchange or self._closing:
            return
        if self._conn.our_state is not h11.DONE or not self._keep_alive:
            self._close()
        elif self._conn.their_state is h11.DONE:
            self._next_cycle()
        elif self._conn.their_state is h11.SEND_BODY:
            exchange.discard_body()  # read and drop the rest, then serve the next request
            self._resume_reading(_READ_PAUSED_FOR_BODY)
        else:
            self._close()

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()

    def body_consumed(self) -> None:
        self._resume_reading(_READ_PAUSED_FOR_BODY)

    # ---- helpers

    def _send(self, event: h11.Event) -> bytes:
        """Hand `event` to h11 and write what it makes of it; returns those bytes."""
        if self._closing or self._transport is None:
            return b""
        try:
            data = self._conn.send(event)
        except h11.LocalProtocolError:
            log.exception("h11 refused an outgoing event; closing the connection")
            self._conn.send_failed()
            self._close()
            return b""
        if data:
            self._write(data)
        return data or b""

    def _write(self, data: bytes) -> None:
        if self._transport is None:
            return
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        """Write what this turn of the loop sent. A decode step's tokens reach the loop together
        and each stream's task sends its own: held to the next turn, the connections' writes go
        out back to back, and a client reading several streams wakes once for them, not once
        each (a wake-up on a 2-core host takes a core from the device's workers)."""
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _reject(self, error: Exception) -> None:
        """A protocol-level failure: answer it if no response started yet, then close."""
        exchange = self._exchange
        if exchange is not None and exchange.task is not None and not exchange.task.done():
            exchange.task.cancel()
        can_answer = self._conn.our_state in (h11.IDLE, h11.SEND_RESPONSE)
        if can_answer and (exchange is None or not exchange.response_started):
            self._keep_alive = False
            if exchange is not None and is_anthropic_path(exchange.request.path):
                status, payload = error_body(error)  # Anthropic's envelope under its paths (413, 408, ...)
                body = orjson.dumps(payload)
            else:
                status, body = error_json(error)
            headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
            self.send_head(status, headers)
            self._send(h11.Data(data=body))
            self._send(h11.EndOfMessage())
            if exchange is not None:
                exchange.response_started = exchange.response_complete = True
                exchange.status = status
                self._log(exchange, str(status))
            else:
                access_log.info("- - %d (%s)", status, type(error).__name__)
        self._close()

    def _check_head(self) -> bool:
        """Reject the request head waiting in h11's buffer if its framing is unsafe; True if fine.

        Runs once per request, when the head is complete (before that, h11 waits for more)."""
        buffered = self._conn.trailing_data[0]
        end = _HEAD_END.search(buffered)
        if end is None:
            return True
        self._head_checked = True
        bad = _BAD_HEAD.search(buffered, 0, end.end())
        if bad is None:
            return True
        found = bad.group()
        if found.startswith(b"\n") and len(found) == 2:
            reason = "obsolete line folding"
        elif found in (b"\r", b"\n"):
            reason = "a line not ended by CRLF"
        else:
            reason = "a control character"
        self._reject(BadHttpRequestError(f"Malformed HTTP request: {reason} in the request head."))
        return False

    def _refuse(self) -> None:
        """Past `max_connections`: answer 503 without reading the request, then close.

        The write side is shut after the answer and what the client sends is read and dropped
        until it closes (at most `_REFUSED_LINGER_S`), so the answer is not lost to a reset."""
        assert self._transport is not None
        self._closing = True
        status, body = error_json(ServiceUnavailableError("Too many open connections; retry later."))
        headers = [
            *self._common_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
        ]
        head = self._conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
        self._transport.write((head or b"") + body)
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._idle_timer = self._loop.call_later(_REFUSED_LINGER_S, self._transport.close)
        access_log.info("- - %d (too many connections: %d)", status, self._config.max_connections)

    def _next_cycle(self) -> None:
        self._cancel_request_timer()
        self._exchange = None
        self._head_checked = False
        try:
            self._conn.start_next_cycle()
        except h11.LocalProtocolError:
            self._close()
            return
        self._resume_reading(_READ_PAUSED_FOR_PIPELINE)
        self._resume_reading(_READ_PAUSED_FOR_BODY)
        if self._conn.trailing_data[0]:
            self._start_request_timer()
            self._loop.call_soon(self._handle_events)  # pipelined request already buffered
        else:
            self._start_idle_timer()

    def _close(self) -> None:
        if not self._closing and self._transport is not None:
            self._flush()  # what was sent goes out before the close
            self._closing = self._closed_by_us = True
            self._cancel_idle_timer()
            self._cancel_request_timer()
            self._transport.close()

    def _pause_reading(self, reason: str) -> None:
        if not self._read_paused and not self._closing and self._transport is not None:
            self._transport.pause_reading()
        self._read_paused.add(reason)

    def _resume_reading(self, reason: str) -> None:
        if reason not in self._read_paused:
            return
        self._read_paused.discard(reason)
        if not self._read_paused and not self._closing and self._transport is not None:
            self._transport.resume_reading()

    def _start_idle_timer(self) -> None:
        self._cancel_idle_timer()
        self._idle_timer = self._loop.call_later(self._config.keep_alive_timeout_s, self._close)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _start_request_timer(self) -> None:
        self._cancel_request_timer()
        self._request_timer = self._loop.call_later(self._config.request_timeout_s, self._on_request_timeout)

    def _cancel_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _arm_write_timer(self) -> None:
        self._cancel_write_timer()
        if self._transport is not None:
            self._write_backlog = self._backlog()
            self._write_timer = self._loop.call_later(self._config.write_timeout_s, self._on_write_timeout)

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _backlog(self) -> int:
        """Bytes written to the transport that the client has not taken yet."""
        try:
            return self._transport.get_write_buffer_size() if self._transport is not None else 0
        except NotImplementedError:  # a transport that does not count them (the unit tests' mock)
            return 0

    def _on_write_timeout(self) -> None:
        """Still write-paused: if the client took some bytes meanwhile, wait again; else drop it."""
        self._write_timer = None
        if self._transport is None or self._writable.is_set():
            return
        if self._backlog() < self._write_backlog:
            self._arm_write_timer()  # progress, however slow
            return
        log.warning("client took no byte for %.1f s; dropping the connection", self._config.write_timeout_s)
        self._dropped_as = "write-timeout"
        self._closing = self._closed_by_us = True
        self._cancel_idle_timer()
        self._cancel_request_timer()
        self._transport.abort()  # close() would wait for the buffer to drain, which never happens

    def _on_request_timeout(self) -> None:
        self._request_timer = None
        self._reject(RequestTimeoutError("The request was not received in full in time."))

    def _log(self, exchange: Exchange, status: str) -> None:
        ms = (time.perf_counter() - exchange.started_at) * 1000.0
        tokens = "" if exchange.usage is None else " tokens={}+{}".format(*exchange.usage)
        request = exchange.request
        access_log.info(
            "%s %s %s %.1fms id=%s%s", request.method, request.path, status, ms, exchange.request_id, tokens
        )


def _chunk_left(conn: h11.Connection) -> int:
    """Bytes h11 still expects in the chunk it is reading (0 outside a chunked body). h11 does
    not publish the chunk size it parsed, so this reads its reader's state; a test pins it."""
    left = getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)
    return left if isinstance(left, int) else 0


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
