"""A zinc server on a fake engine in a background thread, and a raw HTTP/1.1 response reader: what
the server tests that speak to it over sockets share."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, BinaryIO

import uvloop

from tests.fakes import FakeEngine
from zinc.server import Server, ServerConfig, start_server


class RunningServer:
    """`start_server` on a uvloop loop in a background thread."""

    def __init__(self, engine: FakeEngine, **config: Any) -> None:
        self.engine = engine
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_server(engine, ServerConfig(port=0, **config)), self.loop
        )
        self.server: Server = future.result(timeout=5)
        self.port = self.server.port
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout=15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()

    def connect(self, rcvbuf: int | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect, so the window is small from the start
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", self.port))
        return sock

    def connections(self) -> int:
        async def count() -> int:
            return self.server.connection_count

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(timeout=5)

    def wait_for_connections(self, n: int) -> None:
        deadline = time.monotonic() + 5
        while self.connections() != n:
            assert time.monotonic() < deadline, f"{self.connections()} connections, expected {n}"
            time.sleep(0.01)


def read_response(f: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response from a socket file (Content-Length, chunked, or until EOF)."""
    line = f.readline()
    assert line.startswith(b"HTTP/1.1 "), line
    status = int(line.split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, f.read(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int(f.readline(), 16):
            body += f.read(size)
            f.readline()
        f.readline()
        return status, headers, body
    return status, headers, f.read()
