"""The fuzz tier (`pytest --fuzz -m fuzz`, `just test-fuzz`): hostile request bytes and JSON bodies
against a running server, minutes long. Every case must end without a 500, without an error
logged by the server (a handler that raised), without a client left hanging, and with the server
answering `/health` afterwards.

Request bytes and the bodies of all four generation endpoints go to a server on the fake engine
(fast, so thousands of cases run); bodies also go to the real SmolLM2, whose GGUF tokenizer and
Jinja chat template see them (fewer cases, token limits capped). `ZINC_FUZZ_EXAMPLES` sets the
number of cases per test (default 2,000; a tenth of it for the real model).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SessionFactory
from tests.fakes import FakeEngine
from tests.fuzz.strategies import FIELDS, json_body, request_bytes
from tests.server_harness import RunningServer, read_response

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e]
EXAMPLES = int(os.environ.get("ZINC_FUZZ_EXAMPLES", "2000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
REAL = settings(FUZZ, max_examples=max(1, EXAMPLES // 10))
PATHS = sorted(FIELDS)
SERVER_FAULTS = re.compile(rb"(?:^|\n)HTTP/1\.[01] (50[0124])")  # 503 and 505 are answers, not faults
LIMITS: dict[str, Any] = {"request_timeout_s": 2, "max_body_bytes": 256 * 1024, "keep_alive_timeout_s": 2}


class ErrorRecords(logging.Handler):
    """Collects what the server logs at ERROR or above (a handler that raised, a refused event)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        found = [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "") for r in self.records]
        self.records.clear()
        return found


@pytest.fixture(scope="module")
def errors() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    logger = logging.getLogger("zinc")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def fake_srv() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine(context_length=4096), **LIMITS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def real_srv(smollm2: Path, open_session: SessionFactory) -> Iterator[RunningServer]:
    from zinc.engine.engine import LocalEngine
    from zinc.model.gguf_file import open_gguf
    from zinc.tokenizer import ChatTemplate, Tokenizer

    meta = open_gguf(smollm2).metadata
    tokenizer = Tokenizer.from_metadata(meta)
    engine = LocalEngine(
        open_session(smollm2, "cpu"), tokenizer, ChatTemplate.from_metadata(meta, tokenizer), "smollm2"
    )
    running = RunningServer(engine, **LIMITS)  # type: ignore[arg-type]
    yield running
    running.stop()


def assert_healthy(srv: RunningServer) -> None:
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, body = read_response(f)
    assert status == 200 and orjson.loads(body)["status"] == "ok"


def send_raw(srv: RunningServer, data: bytes) -> bytes:
    """Send `data`, end the client's side, and read until the server closes (30 s at most)."""
    received = b""
    with srv.connect() as sock:
        sock.settimeout(30)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server closed first: a rejected request whose rest was never read
    return received


@FUZZ
@given(data=request_bytes())
def test_fuzz_request_bytes(fake_srv: RunningServer, errors: ErrorRecords, data: bytes) -> None:
    errors.take()
    received = send_raw(fake_srv, data)
    assert not SERVER_FAULTS.findall(received), received[:300]
    assert received == b"" or received.startswith(b"HTTP/1.1 "), received[:300]
    assert errors.take() == []
    assert_healthy(fake_srv)


def post(srv: RunningServer, path: str, body: bytes) -> tuple[int, bytes]:
    head = (
        b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nConnection: close\r\n"
        % path.encode()
    )
    with srv.connect() as sock, sock.makefile("rb") as f:
        sock.settimeout(120)  # a client left hanging fails the case
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status, _, payload = read_response(f)
    return status, payload


def check_answer(path: str, status: int, payload: bytes) -> None:
    """No server fault; an error in the endpoint's own envelope; a stream that never fails."""
    assert status < 500, (status, payload[:500])
    if status != 200:
        answer = orjson.loads(payload)
        if path.startswith("/v1/messages"):
            assert answer["type"] == "error" and set(answer["error"]) >= {"type", "message"}
        else:
            assert set(answer["error"]) == {"message", "type", "param", "code"}
        return
    for line in payload.split(b"\n"):
        if line.startswith(b"data: {") or line.startswith(b"data:{"):
            event = orjson.loads(line.split(b":", 1)[1])
            assert "error" not in event or event["error"].get("type") != "server_error", event


@FUZZ
@given(data=st.data(), path=st.sampled_from(PATHS))
def test_fuzz_json_bodies(
    fake_srv: RunningServer, errors: ErrorRecords, data: st.DataObject, path: str
) -> None:
    errors.take()
    body = data.draw(json_body(path))
    status, payload = post(fake_srv, path, body)
    check_answer(path, status, payload)
    assert errors.take() == []
    assert_healthy(fake_srv)


@pytest.mark.slow
@REAL
@given(data=st.data(), path=st.sampled_from(PATHS))
def test_fuzz_json_bodies_real_model(
    real_srv: RunningServer, errors: ErrorRecords, data: st.DataObject, path: str
) -> None:
    errors.take()
    body = data.draw(json_body(path, max_tokens_cap=4))
    status, payload = post(real_srv, path, body)
    check_answer(path, status, payload)
    assert errors.take() == []
    assert_healthy(real_srv)
