"""What a request handler sees of one HTTP request/response cycle.

Owns: `HttpRequest` (a frozen description of the request head), `request_id` (the client's
`X-Request-Id` when it is safe to log, else a new one; the response echoes it) and `Exchange`
(read the body, send exactly one response: whole or streamed). The exchange buffers body bytes handed to it by the
connection and applies read back-pressure through the small `Connection` protocol below; it never
touches h11 or a socket itself.
Imports: the stdlib, zinc.server.error_table.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from zinc.server.error_table import error_json

Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class HttpRequest:
    """The request line and headers; header names are lower-case."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    http_version: str

    def header(self, name: str) -> str | None:
        """The first value of header `name` (case-insensitive), or None."""
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None


# A client's X-Request-Id is kept when it is short visible ASCII without spaces (so it is safe in
# a log line); otherwise the server makes one.
_REQUEST_ID = re.compile(r"[!-~]{1,128}")


def request_id(request: HttpRequest) -> str:
    """The id this request is known by in the logs and its `x-request-id` response header."""
    given = request.header("x-request-id")
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return f"req_{uuid.uuid4().hex}"



class Connection(Protocol):
    """The part of the HTTP connection an exchange drives (implemented by HttpProtocol)."""

    def send_continue(self) -> None: ...

    def send_head(self, status: int, headers: Headers) -> None: ...

    def send_data(self, data: bytes) -> None: ...

    def send_end(self, exchange: Exchange) -> None: ...

    async def drain(self) -> None: ...

    def body_consumed(self) -> None: ...


class Exchange:
    """One request/response cycle: the handler reads the body and sends one response."""

    def __init__(self, connection: Connection, request: HttpRequest) -> None:
        self.request = request
        self.request_id = request_id(request)
        self.started_at = time.perf_counter()
        self.status: int | None = None
        self.response_started = False
        self.response_complete = False
        self.usage: tuple[int, int] | None = None  # (prompt, completion) tokens, for the log
        self.task: asyncio.Task[None] | None = None
        self.received_bytes = 0
        self.buffered_bytes = 0
        self.body_complete = False
        self._connection = connection
        self._chunks: list[bytes] = []
        self._body_event = asyncio.Event()

    # ---- request body (fed by the connection, read by the handler)

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self.buffered_bytes += len(data)
        self._body_event.set()

    def feed_end(self) -> None:
        self.body_complete = True
        self._body_event.set()

    def discard_body(self) -> None:
        self._chunks.clear()
        self.buffered_bytes = 0

    async def body(self) -> bytes:
        """The whole request body; sends `100 Continue` first if the client waits for it."""
        self._connection.send_continue()
        parts: list[bytes] = []
        while True:
            if self._chunks:
                parts.extend(self._chunks)
                self.discard_body()
                self._connection.body_consumed()
            if self.body_complete:
                return b"".join(parts)
            self._body_event.clear()
            await self._body_event.wait()

    # ---- response

    def note_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.usage = (prompt_tokens, completion_tokens)

    async def respond(self, status: int, headers: Headers, body: bytes) -> None:
        """Send a complete response with a Content-Length."""
        self._start(status, [*headers, ("content-length", str(len(body)))])
        if body:
            self._connection.send_data(body)
        self._finish()

    async def respond_json(self, status: int, body: bytes, headers: Headers = ()) -> None:
        await self.respond(status, [("content-type", "application/json"), *headers], body)

    async def respond_error(self, exc: BaseException, headers: Headers = ()) -> None:
        """The OpenAI error envelope for `exc`, with the status from the error table."""
        status, body = error_json(exc)
        await self.respond_json(status, body, headers)

    async def start_stream(self, status: int, headers: Headers) -> None:
        """Send the head of a response of unknown length (chunked for HTTP/1.1 peers)."""
        self._start(status, headers)

    async def send(self, data: bytes) -> None:
        """Send one piece of a streamed body, first waiting while the peer is slow to read."""
        if not self.response_started or self.response_complete:
            raise RuntimeError("send() outside a streamed response")
        await self._connection.drain()
        if data:
            self._connection.send_data(data)

    async def end(self) -> None:
        """Finish a streamed response."""
        if not self.response_complete:
            self._finish()

    def _start(self, status: int, headers: Headers) -> None:
        if self.response_started:
            raise RuntimeError("a response was already started for this request")
        self.response_started = True
        self.status = status
        self._connection.send_head(status, headers)

    def _finish(self) -> None:
        self.response_complete = True
        self._connection.send_end(self)
