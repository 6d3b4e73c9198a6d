"""SIGTERM under load, with real server processes: running streams finish within the shutdown
timeout and the process exits 0, new connections are refused meanwhile, and a second SIGTERM or a
SIGINT exits at once (status 128 + the signal's number), cutting what still runs; with
--drain-delay, /health first says 503 while requests are still served.

Two kinds of server: `serve()` on a fake engine whose generations hold after their first token
until a line comes on the server's stdin (so the streams are running when the signal comes,
whatever the machine's speed), and `zinc serve` itself on a tiny real model, where the request in
progress is one whose body the client has sent only half of (held the same way, by the client).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import orjson
import pytest

from tests.fakes import expected_text
from tests.server_harness import read_response

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
STARTUP_S = 300  # a first `zinc serve` compiles its model (a tiny one, cached after the first run)

# `serve()` on a fake engine whose streams hold after their first token until stdin has a line
HELD_SERVER = """
import asyncio, contextlib, sys
from tests.fakes import FakeEngine
from zinc.server import ServerConfig, serve

class HeldEngine(FakeEngine):
    def __init__(self):
        super().__init__(token_delay=0.001)
        self._lock = asyncio.Semaphore(64)  # the fake runs one generation at a time; here all run
        self.release = None

    def generate(self, request):
        return self._held(super().generate(request))

    async def _held(self, events):
        if self.release is None:
            self.release = asyncio.Event()
            asyncio.get_running_loop().add_reader(sys.stdin.fileno(), self.release.set)
        async with contextlib.aclosing(events):
            first = True
            async for event in events:
                yield event
                if first:
                    first = False
                    await self.release.wait()

sys.exit(serve(HeldEngine(), ServerConfig(port=int(sys.argv[1]), graceful_shutdown_timeout_s=float(sys.argv[2]))))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.settimeout(30)  # a hang fails the test instead of stalling it
    return sock


def wait_until_serving(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        try:
            with connect(port) as sock, sock.makefile("rb") as f:
                sock.sendall(HEALTH)
                if read_response(f)[0] == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def wait_until_refused(port: int) -> None:
    """The signal reaches the server asynchronously: connect until the listener is gone. A
    connection made before that is served or closed, never left hanging."""
    deadline = time.monotonic() + 10
    while True:
        try:
            with connect(port) as sock, sock.makefile("rb") as f:
                sock.sendall(HEALTH)
                served = (b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 503 Service Unavailable\r\n")
                assert f.readline() in served  # served before (ready, or draining), or closed
        except ConnectionRefusedError:
            return
        except ConnectionResetError:
            pass
        assert time.monotonic() < deadline, "new connections are still accepted"
        time.sleep(0.01)


def chat_stream(max_tokens: int) -> bytes:
    body = orjson.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    )
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def read_chunk(f: BinaryIO) -> bytes | None:
    """One chunk of a chunked body; None at its end or at EOF (a cut stream)."""
    size_line = f.readline()
    if not size_line.strip():
        return None
    if int(size_line, 16) == 0:
        f.readline()  # the CRLF after the last chunk
        return None
    data = f.read(int(size_line, 16))
    f.readline()
    return data


def start_stream(port: int, max_tokens: int) -> tuple[socket.socket, BinaryIO, bytes]:
    """A streamed chat request, read up to its first token's event."""
    sock = connect(port)
    f = sock.makefile("rb")
    sock.sendall(chat_stream(max_tokens))
    assert f.readline().startswith(b"HTTP/1.1 200")
    while f.readline() not in (b"\r\n", b""):
        pass
    received = b""
    while b'"content":' not in received:  # the role chunk, then the first token's
        chunk = read_chunk(f)
        assert chunk is not None
        received += chunk
    return sock, f, received


def rest_of(f: BinaryIO) -> bytes:
    body = b""
    while (chunk := read_chunk(f)) is not None:
        body += chunk
    return body


def streamed_text(body: bytes) -> tuple[str, str | None]:
    """The content and finish reason of a chat SSE body."""
    text, finish = "", None
    for line in body.decode().split("\n"):
        if line.startswith("data: {"):
            choice = orjson.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
    return text, finish


@pytest.fixture
def held_server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The held fake-engine server with a 600 s shutdown timeout (nothing here waits that long)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_SERVER, str(port), "600"],
        cwd=REPO, env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until_serving(proc, port)
        yield proc, port
    finally:
        proc.kill()
        proc.communicate()


def test_sigterm_lets_running_streams_finish_and_exits_0(
    held_server: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = held_server
    streams = [start_stream(port, 20) for _ in range(4)]  # each held after its first token
    with connect(port) as idle:
        idle.sendall(HEALTH)
        with idle.makefile("rb") as idle_f:
            assert read_response(idle_f)[0] == 200  # a keep-alive connection, idle now
            proc.send_signal(signal.SIGTERM)
            assert idle_f.read() == b""  # idle connections are closed at once
    wait_until_refused(port)
    assert proc.poll() is None  # the held streams keep it running
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")  # the streams go on
    proc.stdin.flush()
    for sock, f, first in streams:
        text, finish = streamed_text(first + rest_of(f))
        assert (text, finish) == (expected_text(20), "length")  # whole, not cut
        assert f.read() == b""  # then the connection is closed
        f.close()
        sock.close()
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr and b"cancelling" not in stderr


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once(
    held_server: tuple[subprocess.Popen[bytes], int], second: signal.Signals
) -> None:
    proc, port = held_server
    streams = [start_stream(port, 20) for _ in range(3)]  # held until stdin has a line: never, here
    proc.send_signal(signal.SIGTERM)
    wait_until_refused(port)
    assert proc.poll() is None  # shutting down gracefully: the streams could still finish
    proc.send_signal(second)
    # it exits without the streams ever going on, long before the 600 s shutdown timeout
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + second, stderr.decode()
    assert f"{second.name} during shutdown".encode() in stderr and b"cancelling 3 request(s)" in stderr
    assert b"Traceback" not in stderr
    for sock, f, _ in streams:
        body = rest_of(f)
        assert b"[DONE]" not in body  # cut, not finished
        f.close()
        sock.close()


# ---- `zinc serve` itself, on a tiny real model


def half_sent_request(port: int, max_tokens: int) -> tuple[socket.socket, BinaryIO, bytes]:
    """A streamed completion whose head and half of its body are sent: a request in progress
    that the client, not the machine's speed, holds. `Expect: 100-continue` makes the server say
    when its handler waits for the body. Returns the socket, its file and the other half."""
    body = orjson.dumps({"prompt": "the end", "max_tokens": max_tokens, "stream": True})
    sock = connect(port)
    f = sock.makefile("rb")
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    sock.sendall(head % len(body))
    assert f.readline().startswith(b"HTTP/1.1 100 ") and f.readline() == b"\r\n"
    half = len(body) // 2
    sock.sendall(body[:half])
    return sock, f, body[half:]


def zinc_serve(model: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "zinc", "serve", "-m", str(model), "-p", str(port), "--device", "cpu",
         "-c", "256", *args],
        cwd=REPO, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_zinc_serve_finishes_a_request_in_progress_after_sigterm(tiny_models: dict[str, Path]) -> None:
    port = free_port()
    proc = zinc_serve(tiny_models["tiny-q8-q41"], port, "--shutdown-timeout", "300")
    try:
        wait_until_serving(proc, port)
        sock, f, rest = half_sent_request(port, 8)
        proc.send_signal(signal.SIGTERM)
        wait_until_refused(port)
        assert proc.poll() is None  # waiting for the request in progress
        with sock, f:
            sock.sendall(rest)
            status, headers, body = read_response(f)
        assert status == 200 and headers["connection"] == "close"
        assert body.endswith(b"data: [DONE]\n\n")
        events = [orjson.loads(line[6:]) for line in body.decode().split("\n") if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] in ("length", "stop")
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr.decode()
    assert b"POST /v1/completions 200" in stderr and b"Traceback" not in stderr


def test_zinc_serve_exits_at_once_on_a_second_signal(tiny_models: dict[str, Path]) -> None:
    port = free_port()
    proc = zinc_serve(tiny_models["tiny-q8-q41"], port, "--shutdown-timeout", "600")
    try:
        wait_until_serving(proc, port)
        sock, f, _ = half_sent_request(port, 8)  # the rest is never sent
        proc.send_signal(signal.SIGTERM)
        wait_until_refused(port)
        assert proc.poll() is None  # waiting for the request in progress
        proc.send_signal(signal.SIGINT)  # it exits long before the 600 s shutdown timeout
        _, stderr = proc.communicate(timeout=60)
        with sock, f:
            assert f.read() == b""  # dropped without an answer
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr.decode()
    assert b"SIGINT during shutdown" in stderr and b"Traceback" not in stderr


def test_zinc_serve_drains_before_it_stops_listening(tiny_models: dict[str, Path]) -> None:
    """With --drain-delay, SIGTERM first turns readiness off (/health 503 "draining") while new
    connections and requests are still served, as a balancer's health checks need; then the
    listener closes and the process exits 0."""
    port = free_port()
    proc = zinc_serve(tiny_models["tiny-q8-q41"], port, "--drain-delay", "3")
    try:
        wait_until_serving(proc, port)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = signalled + 2
        while True:  # the signal reaches the server asynchronously
            with connect(port) as sock, sock.makefile("rb") as f:
                sock.sendall(HEALTH)
                status, _, body = read_response(f)
            if status == 503:
                break
            assert time.monotonic() < deadline, "/health did not turn 503"
        assert orjson.loads(body)["status"] == "draining"
        with connect(port) as sock, sock.makefile("rb") as f:  # a new connection, still served
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(f)[0] == 200
            request = orjson.dumps({"prompt": "the end", "max_tokens": 4})
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(request), request))
            status, _, body = read_response(f)
            assert status == 200 and orjson.loads(body)["usage"]["completion_tokens"] > 0
        assert time.monotonic() - signalled < 3  # all that happened within the delay
        wait_until_refused(port)
        assert time.monotonic() - signalled >= 2.9  # and the listener stayed open for all of it
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr.decode()
    assert b"draining: /health says 503 for 3 s" in stderr and b"Traceback" not in stderr


def test_shutdown_timeout_reaches_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--shutdown-timeout` becomes `graceful_shutdown_timeout_s` (10 s by default); a value that is
    not a positive number of seconds stops before serving."""
    import logging
    from dataclasses import replace

    import typer

    import zinc.server
    from zinc.cli_serve import ServeOptions, run_server
    from zinc.server import ServerConfig

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")  # only its existence is checked before serving
    seen: list[ServerConfig] = []
    monkeypatch.setattr(zinc.server, "serve", lambda manager, config, initial_model: seen.append(config))
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    options = ServeOptions(str(model), "cpu", "local-task", 128, "127.0.0.1", 0, 2, None)
    run_server(options)
    run_server(replace(options, shutdown_timeout=2.5, drain_delay=4.0))
    assert [c.graceful_shutdown_timeout_s for c in seen] == [10.0, 2.5]
    assert [c.drain_delay_s for c in seen] == [0.0, 4.0]
    with pytest.raises(typer.Exit):
        run_server(replace(options, drain_delay=-1.0))
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(typer.Exit):
            run_server(replace(options, shutdown_timeout=bad))
    assert len(seen) == 2
