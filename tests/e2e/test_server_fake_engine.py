"""The server on a real loopback port (port 0) with the fake engine: the official openai client,
raw sockets for HTTP semantics, an abrupt disconnect, `serve()` under signals, and a bounded fuzz."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import FakeEngine, expected_text
from tests.server_harness import RunningServer, read_response

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
MODEL = "fake-model"
HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(token_delay=0.001))
    yield running
    running.stop()


@pytest.fixture
def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=10)


def chat_request(max_tokens: int, stream: bool = False, close: bool = False) -> bytes:
    body = orjson.dumps({"messages": HI, "max_tokens": max_tokens, "stream": stream})
    connection = b"Connection: close\r\n" if close else b""
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (
        connection, len(body), body)  # fmt: skip


# ---- the official openai client


def test_openai_sync_chat(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5)
    assert completion.choices[0].message.content == expected_text(5)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_openai_sync_chat_stream_with_stop_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=50,
        stop=["fox"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world! The quick brown "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    )


def test_openai_sync_completions(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, temperature=0.5, top_p=0.9)
    assert completion.choices[0].text == expected_text(3)
    stream = client.completions.create(model=MODEL, prompt="hi", max_tokens=3, stream=True, seed=1, stop="!")
    assert "".join(c.choices[0].text for c in stream) == "Hello, world"


def test_openai_models_and_errors(srv: RunningServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="x" * 2000, stream=True)
    assert too_long.value.code == "context_length_exceeded"


def test_openai_async_client(srv: RunningServer) -> None:
    async def main() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0) as aclient:
            whole = await aclient.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
            stream = await aclient.completions.create(model=MODEL, prompt="hi", max_tokens=4, stream=True)
            text = "".join([c.choices[0].text async for c in stream])
            return whole.choices[0].message.content or "", text

    assert asyncio.run(main()) == (expected_text(4), expected_text(4))


def test_openai_client_with_api_key() -> None:
    running = RunningServer(FakeEngine(), api_key="sekrit")
    try:
        good = openai.OpenAI(base_url=running.base_url, api_key="sekrit", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=HI, max_tokens=1).choices
        bad = openai.OpenAI(base_url=running.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    finally:
        running.stop()


# ---- raw sockets


def test_keep_alive_then_close(srv: RunningServer) -> None:
    with srv.connect() as sock, sock.makefile("rb") as f:
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, _ = read_response(f)
            assert status == 200 and headers.get("connection") != "close"
        sock.sendall(chat_request(2, close=True))
        status, headers, _ = read_response(f)
        assert status == 200 and headers["connection"] == "close"
        assert sock.recv(1) == b""  # the server closed


def test_http10_is_closed_after_the_response(srv: RunningServer) -> None:
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        status, _, body = read_response(f)  # no framing: read until EOF
        assert status == 200 and orjson.loads(body)["status"] == "ok"


def test_pipelined_requests_are_answered_in_order(srv: RunningServer) -> None:
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(
            chat_request(6, stream=True) + b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n" + chat_request(2)
        )
        first, second, third = (read_response(f) for _ in range(3))
    assert first[1]["content-type"] == "text/event-stream" and first[2].endswith(b"data: [DONE]\n\n")
    assert orjson.loads(second[2])["object"] == "list"
    assert orjson.loads(third[2])["choices"][0]["message"]["content"] == expected_text(2)


def test_abrupt_disconnect_mid_stream_aborts_and_frees_the_engine(srv: RunningServer) -> None:
    """A client that resets its connection mid-stream has its generation aborted, and the next
    request is served: the fake engine runs one generation at a time, so had the aborted one
    kept its slot (100,000 tokens), the next would never be answered within the socket's 5 s
    timeout. (No bound on how soon it is answered: that is a latency, not what this checks.)"""
    engine = srv.engine
    sock = srv.connect()
    sock.sendall(chat_request(100_000, stream=True))
    assert b"data: " in sock.recv(4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.close()
    deadline = time.monotonic() + 3
    while engine.started[-1] not in engine.aborts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.started[-1] in engine.aborts
    with srv.connect() as again, again.makefile("rb") as f:  # times out after 5 s
        again.sendall(chat_request(2))
        assert read_response(f)[0] == 200


def test_graceful_shutdown_finishes_streams_then_cancels_stragglers() -> None:
    """Shutdown closes idle connections at once, lets a short stream run to its end, and cuts a
    stream that outlasts the grace period (`graceful_shutdown_timeout_s`, 0.5 s) when that runs
    out, not before: the only timing asserted is that lower bound, which a slow host cannot
    break (0.45 s: the loop's timers may fire a little early). That it ends at all is checked by
    waiting for it (5 s), not by a bound on how soon."""
    running = RunningServer(FakeEngine(token_delay=0.01), graceful_shutdown_timeout_s=0.5)
    engine = running.engine
    try:
        with (
            running.connect() as idle,
            running.connect() as short,
            running.connect() as long,
            short.makefile("rb") as short_f,
            long.makefile("rb") as long_f,
        ):
            short.sendall(chat_request(20, stream=True))
            assert short_f.readline().startswith(b"HTTP/1.1 200")
            long.sendall(chat_request(100_000, stream=True))
            time.sleep(0.05)
            started = time.monotonic()
            closing = asyncio.run_coroutine_threadsafe(running.server.close(), running.loop)
            assert idle.recv(1) == b""  # idle keep-alive connections are closed at once
            body = short_f.read()  # the short stream runs to its end, then the connection closes
            assert body.rstrip(b"\r\n0").endswith(b"data: [DONE]")
            long_f.read()  # the long one is cut off at the timeout
            closing.result(timeout=5)
            assert time.monotonic() - started >= 0.45  # its grace period (less a timer's slack)
        assert engine.completed == engine.started[:1] and engine.aborts == engine.started[1:]
    finally:
        running.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_runs_until_a_signal_and_shuts_down_cleanly(sig: signal.Signals) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import logging\nfrom tests.fakes import FakeEngine\nfrom zinc.server import ServerConfig, serve\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"serve(FakeEngine(), ServerConfig(port={port}, graceful_shutdown_timeout_s=1))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with (
                        socket.create_connection(("127.0.0.1", port), timeout=1) as sock,
                        sock.makefile("rb") as f,
                    ):
                        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
                        assert read_response(f)[0] == 200
                        break
                except ConnectionRefusedError:
                    assert time.monotonic() < deadline, "server did not start"
                    time.sleep(0.05)
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=10)
        finally:
            proc.kill()
    assert proc.returncode == 0
    assert b"GET /health 200" in stderr and b"Traceback" not in stderr


# ---- bounded fuzz: the server survives anything and still answers /health


@pytest.fixture(scope="module")
def fuzz_srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(context_length=4096), request_timeout_s=1, max_body_bytes=64 * 1024)
    yield running
    running.stop()


def assert_healthy(srv: RunningServer) -> None:
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[0] == 200


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@FUZZ
@given(
    data=st.binary(max_size=1024) | st.builds(lambda b: b"POST /v1/completions HTTP/1.1\r\n" + b, st.binary())
)
def test_fuzz_raw_bytes(fuzz_srv: RunningServer, data: bytes) -> None:
    with fuzz_srv.connect() as sock:
        sock.settimeout(2)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass
    assert_healthy(fuzz_srv)


FIELDS = ["messages", "prompt", "model", "max_tokens", "temperature", "top_p", "top_k", "stop", "stream",
          "stream_options", "logit_bias", "seed", "n", "repeat_penalty", "max_completion_tokens"]  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]), "content": JSON})


@FUZZ
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=st.dictionaries(
        st.sampled_from(FIELDS), JSON | st.lists(MESSAGE, min_size=1, max_size=3), max_size=6
    ),
)
def test_fuzz_json_bodies(fuzz_srv: RunningServer, path: str, body: dict[str, Any]) -> None:
    body.setdefault("max_tokens", 3)
    data = orjson.dumps(body)
    with fuzz_srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)
        )
        status, _, payload = read_response(f)
    assert status in (200, 400, 404, 429), payload
    if status != 200:
        assert set(orjson.loads(payload)["error"]) == {"message", "type", "param", "code"}
    assert_healthy(fuzz_srv)
