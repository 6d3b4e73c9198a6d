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
is being produced. Each request is handed to a `Handler` coroutine with an `Exchange`.
Policy: a response that ends before the body was read drains the rest of the body (or closes, if
the client still waits for 100-continue); EOF from the client counts as a disconnect.
Imports: h11, asyncio, the stdlib, zinc.server.{config, error_table, exchange}.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections.abc import Awaitable, Callable
from typing import cast

import h11

from zinc.server.config import ServerConfig
from zinc.server.error_table import (
    BadHttpRequestError,
    HeadersTooLargeError,
    PayloadTooLargeError,
    RequestTimeoutError,
    error_json,
)
from zinc.server.exchange import Exchange, Headers, HttpRequest

Handler = Callable[[HttpRequest, Exchange], Awaitable[None]]

access_log = logging.getLogger("zinc.server.access")
log = logging.getLogger("zinc.server")

_READ_PAUSED_FOR_PIPELINE = "pipeline"
_READ_PAUSED_FOR_BODY = "body"


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
        self._read_paused: set[str] = set()
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._request_timer: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []  # bytes for the transport, written at the loop's next turn
        self._chunked = False  # the response in progress is in chunked transfer-coding (h11 chose it)

    # ---- asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self._registry is not None:
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
        self._writable.set()  # wake a writer waiting for drain; its task is cancelled below
        if self._registry is not None:
            self._registry.discard(self)
        exchange, self._exchange = self._exchange, None
        if exchange is not None and not exchange.response_complete:
            self._log(exchange, "cancelled" if self._closed_by_us else "client-disconnected")
        if exchange is not None and exchange.task is not None and not exchange.task.done():
            exchange.task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
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
            # SSE event paid about 15 us of the event loop's CPU for it (docs/PERFORMANCE.md,
            # History). h11 still writes the head and the last chunk (EndOfMessage).
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

    def _next_cycle(self) -> None:
        self._cancel_request_timer()
        self._exchange = None
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

    def _on_request_timeout(self) -> None:
        self._request_timer = None
        self._reject(RequestTimeoutError("The request was not received in full in time."))

    def _log(self, exchange: Exchange, status: str) -> None:
        ms = (time.perf_counter() - exchange.started_at) * 1000.0
        tokens = "" if exchange.usage is None else " tokens={}+{}".format(*exchange.usage)
        request = exchange.request
        access_log.info("%s %s %s %.1fms%s", request.method, request.path, status, ms, tokens)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
