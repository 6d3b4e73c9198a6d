"""The fuzz tier's servers and checks (tests/fuzz/conftest.py gives the servers as fixtures): a
case passes when it ends without a 500, without an error the server logged (a handler that
raised), without a client left hanging, and with `/health` answering afterwards.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

import orjson
from hypothesis import event

from tests.server_harness import RunningServer, read_response

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


def check_raw_case(srv: RunningServer, errors: ErrorRecords, data: bytes) -> None:
    errors.take()
    received = send_raw(srv, data)
    event(f"status {received[9:12].decode(errors='replace') or 'none (closed)'}")
    assert not SERVER_FAULTS.findall(received), received[:300]
    assert received == b"" or received.startswith(b"HTTP/1.1 "), received[:300]
    assert errors.take() == []
    assert_healthy(srv)


def check_json_case(srv: RunningServer, errors: ErrorRecords, path: str, body: bytes) -> None:
    errors.take()
    status, payload = post(srv, path, body)
    event(f"{path} {status}")  # how deep the cases got: `--hypothesis-show-statistics`
    check_answer(path, status, payload)
    assert errors.take() == []
    assert_healthy(srv)
