"""The server under load: 64 clients at once against `--parallel 8 --max-queue 16` (chat and text
completions and Anthropic messages, streamed and not).

Every admitted generation is held at its start (a gate in the fake engine) until all 64 requests
are in, so they really are concurrent whatever the machine's speed: exactly the excess (64 - 8 -
16 = 40) get 429 with `Retry-After`, the 24 admitted all complete once the gate opens, none hangs
(each client's socket has a timeout), and every connection is closed afterwards.

And a flood of idle connections past `max_connections`, in a `serve()` process whose soft limit on
open files is below that cap: the server raises the limit, so exactly the connections past the cap
get 503 and `/health` still answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from tests.fakes import FakeEngine, expected_text
from tests.server_harness import RunningServer, read_response
from zinc.engine.types import GenerationRequest, TextDelta

pytestmark = pytest.mark.e2e
CLIENTS, PARALLEL, MAX_QUEUE = 64, 8, 16
MAX_TOKENS = 12


class GatedEngine(FakeEngine):
    """A fake engine whose generations wait for `gate` before their first token."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = asyncio.Semaphore(CLIENTS)  # the fake runs one generation at a time; here all run
        self.gate = asyncio.Event()
        self.held = 0  # generations that reached the gate

    def generate(self, request: GenerationRequest) -> AsyncIterator[TextDelta]:
        return self._gated(super().generate(request))

    async def _gated(self, events: AsyncIterator[TextDelta]) -> AsyncIterator[TextDelta]:
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            self.held += 1
            await self.gate.wait()
            async for event in events:
                yield event


@pytest.fixture
def srv() -> Iterator[RunningServer]:
    running = RunningServer(GatedEngine(), parallel=PARALLEL, max_queued_requests=MAX_QUEUE)
    yield running
    running.stop()


APIS = ("chat", "text", "messages")  # client i speaks APIS[i // 2 % 3], streamed when i is odd


def request_bytes(i: int) -> bytes:
    """Client i's request: a chat completion, a text completion or an Anthropic message, streamed
    or not, by turns."""
    content = f"client {i}"
    path, body = {
        "chat": (b"/v1/chat/completions", {"messages": [{"role": "user", "content": content}]}),
        "text": (b"/v1/completions", {"prompt": content}),
        "messages": (b"/v1/messages", {"messages": [{"role": "user", "content": content}]}),
    }[APIS[i // 2 % 3]]
    data = orjson.dumps({**body, "max_tokens": MAX_TOKENS, "stream": i % 2 == 1})
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
    return head % (path, len(data)) + data


def text_of(i: int, body: bytes) -> tuple[str, str]:
    """The generated text and why it ended ("length": the token limit) of client i's 200 response."""
    api = APIS[i // 2 % 3]
    if i % 2 == 0:
        answer = orjson.loads(body)
        if api == "messages":
            assert answer["stop_reason"] == "max_tokens"
            return "".join(block["text"] for block in answer["content"]), "length"
        choice = answer["choices"][0]
        return (choice["message"]["content"] if api == "chat" else choice["text"]), choice["finish_reason"]
    text, finish = "", ""
    for line in body.decode().split("\n"):
        if not line.startswith("data: {"):
            continue
        event = orjson.loads(line[6:])
        if api == "messages":
            if event["type"] == "content_block_delta":
                text += event["delta"]["text"]
            elif event["type"] == "message_delta":
                finish = (
                    "length"
                    if event["delta"]["stop_reason"] == "max_tokens"
                    else event["delta"]["stop_reason"]
                )
            continue
        choice = event["choices"][0]
        text += (choice.get("delta", {}).get("content") if api == "chat" else choice["text"]) or ""
        finish = choice["finish_reason"] or finish
    assert body.endswith(b'"type":"message_stop"}\n\n' if api == "messages" else b"data: [DONE]\n\n")
    return text, finish


def test_64_clients_exactly_the_excess_get_429_and_the_rest_complete(srv: RunningServer) -> None:
    engine = srv.engine
    assert isinstance(engine, GatedEngine)
    refused = threading.Semaphore(0)

    def client(i: int) -> tuple[int, dict[str, str], bytes]:
        with srv.connect() as sock, sock.makefile("rb") as f:
            sock.settimeout(60)  # a client left hanging fails the test
            sock.sendall(request_bytes(i))
            status, headers, body = read_response(f)
        if status == 429:
            refused.release()
        return status, headers, body

    def health() -> dict[str, int]:
        with srv.connect() as sock, sock.makefile("rb") as f:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            status, _, body = read_response(f)
        assert status == 200
        data: dict[str, int] = orjson.loads(body)
        return data

    excess = CLIENTS - PARALLEL - MAX_QUEUE
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(client, i) for i in range(CLIENTS)]
        for _ in range(excess):  # the excess is answered while the admitted ones are held
            assert refused.acquire(timeout=60), "the excess was not refused at once"
        deadline = time.monotonic() + 60
        while engine.held < PARALLEL or health()["queued_requests"] < MAX_QUEUE:
            assert time.monotonic() < deadline, (engine.held, health())
            time.sleep(0.01)
        assert (engine.held, health()["queued_requests"]) == (PARALLEL, MAX_QUEUE)  # all 64 are in
        assert not any(f.done() and f.result()[0] != 429 for f in futures)  # nobody else answered yet
        srv.loop.call_soon_threadsafe(engine.gate.set)
        results = [f.result(timeout=60) for f in futures]

    assert Counter(status for status, _, _ in results) == {200: PARALLEL + MAX_QUEUE, 429: excess}
    for i, (status, headers, body) in enumerate(results):
        if status == 429:
            assert headers["retry-after"] == "1" and headers["connection"] == "close"
            answer = orjson.loads(body)
            if APIS[i // 2 % 3] == "messages":  # Anthropic's envelope
                assert answer["type"] == "error" and answer["error"]["type"] == "rate_limit_error"
            else:
                assert (answer["error"]["type"], answer["error"]["code"]) == (
                    "rate_limit_error",
                    "queue_full",
                )
        else:
            assert text_of(i, body) == (expected_text(MAX_TOKENS), "length")
    admitted = PARALLEL + MAX_QUEUE
    assert engine.held == admitted and len(engine.completed) == admitted and engine.aborts == []
    assert health()["queued_requests"] == 0 and health()["active_requests"] == 0
    srv.wait_for_connections(0)


FLOOD_SERVER = """
import sys
from tests.fakes import FakeEngine
from zinc.server import ServerConfig, serve
config = ServerConfig(port=int(sys.argv[1]), max_connections=int(sys.argv[2]), keep_alive_timeout_s=300)
sys.exit(serve(FakeEngine(), config))
"""


def test_a_connection_flood_past_the_cap_under_a_low_open_file_limit() -> None:
    """Soft `ulimit -n` 128, `max_connections` 200, 300 idle connections: 199 held besides the
    one /health uses, 101 answered 503, none dropped unanswered (as past the OS's file limit)."""
    from tests.e2e.test_sigterm import free_port, wait_until_serving

    cap, flood = 200, 300
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    script = f'ulimit -Sn 128 && exec "{sys.executable}" -c "$0" {port} {cap}'
    proc = subprocess.Popen(["bash", "-c", script, FLOOD_SERVER], env=env, stderr=subprocess.PIPE)
    idle: list[socket.socket] = []
    try:
        wait_until_serving(proc, port)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = int(next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3])
        assert soft >= cap  # raised from 128
        with socket.create_connection(("127.0.0.1", port), timeout=30) as health, health.makefile("rb") as f:
            idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(flood)]
            answered: set[socket.socket] = set()
            deadline = time.monotonic() + 60
            while len(answered) < flood - cap + 1:  # the refused ones are answered at once
                assert time.monotonic() < deadline, len(answered)
                readable, _, _ = select.select([s for s in idle if s not in answered], [], [], 1)
                answered.update(readable)
            for sock in answered:
                status, headers, _ = read_response(sock.makefile("rb"))
                assert status == 503 and headers["retry-after"] == "1"
            held = [s for s in idle if s not in answered]
            assert len(held) == cap - 1
            assert select.select(held, [], [], 0.5)[0] == []  # held open, nothing sent, not closed
            health.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(f)[0] == 200
    finally:
        for sock in idle:
            sock.close()
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0 and b"Traceback" not in stderr, stderr.decode()


def test_open_file_limit_is_raised_to_the_hard_one_or_warned_about() -> None:
    code = (
        "import logging, resource\nfrom zinc.server.app import raise_open_file_limit\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "print(raise_open_file_limit(1024), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    lowered = 2000 if hard == resource.RLIM_INFINITY else min(hard, 2000)  # a hard limit may only go down
    for limits, expected, warned in (
        (f"-Sn 128 && ulimit -Hn {lowered}", f"{lowered} {lowered}", lowered < 1024 + 64),
        ("-n 100", "100 100", True),
    ):
        script = f'ulimit {limits} && exec "{sys.executable}" -c "$0"'
        proc = subprocess.run(
            ["bash", "-c", script, code], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == expected.split()
        assert ("fewer than --max-connections 1024" in proc.stderr) == warned, proc.stderr
