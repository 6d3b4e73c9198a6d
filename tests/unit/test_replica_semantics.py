"""What a load balancer and an autoscaler read from a replica: readiness while draining, liveness,
request ids, the X-Session-Id header, and the metrics an endpoint picker scales or routes on."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx2
import pytest

from tests.fakes import FakeEngine
from tests.server_harness import RunningServer

CHAT = {"messages": [{"role": "user", "content": "tell me about the sea"}], "max_tokens": 4}


@pytest.fixture
def server() -> Iterator[RunningServer]:
    running = RunningServer(FakeEngine())
    try:
        yield running
    finally:
        running.stop()


def _client(server: RunningServer) -> httpx2.Client:
    return httpx2.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10)


def _drain(server: RunningServer) -> None:
    """`Server.drain` on the server's loop, as SIGTERM starts it (no delay: the server stays in
    that state, as it would for `--drain-delay` seconds)."""
    asyncio.run_coroutine_threadsafe(server.server.drain(0), server.loop).result(timeout=5)


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} is not exported"
    return float(match.group(1))


def test_a_valid_request_id_is_echoed_and_a_bad_one_replaced(server: RunningServer) -> None:
    with _client(server) as client:
        given = client.get("/health", headers={"x-request-id": "lb-7f3a:42"})
        assert given.headers["x-request-id"] == "lb-7f3a:42"
        made = client.post("/v1/chat/completions", json=CHAT)
        assert re.fullmatch(r"req_[0-9a-f]{32}", made.headers["x-request-id"])
        other = client.post("/v1/chat/completions", json=CHAT)
        assert other.headers["x-request-id"] != made.headers["x-request-id"]
        spaced = client.get("/health", headers={"x-request-id": "two words"})  # unsafe in a log line
        assert spaced.headers["x-request-id"].startswith("req_")
        long = client.get("/health", headers={"x-request-id": "x" * 129})
        assert long.headers["x-request-id"].startswith("req_")
        assert "x-request-id" in given.headers["access-control-expose-headers"]


def test_the_request_id_is_in_the_access_log(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="zinc.server.access"), _client(server) as client:
        client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "trace-1"})
    lines = [r.getMessage() for r in caplog.records if r.name == "zinc.server.access"]
    assert any(line.startswith("POST /v1/chat/completions 200 ") and " id=trace-1" in line for line in lines)


def test_the_session_header_keeps_a_conversation_and_the_body_wins(server: RunningServer) -> None:
    engine = server.engine
    with _client(server) as client:
        client.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "conv-1"})
        client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers={"x-session-id": "conv-2"})
        client.post("/v1/chat/completions", json={**CHAT, "session_id": "body"}, headers={"x-session-id": "hdr"})
        client.post("/v1/chat/completions", json=CHAT)
    assert [r.session_id for r in engine.requests] == ["conv-1", "conv-2", "body", None]


def test_a_draining_replica_fails_readiness_but_serves_and_stays_live(server: RunningServer) -> None:
    with _client(server) as client:
        assert client.get("/health").status_code == 200
        assert _metric(client.get("/metrics").text, "zinc_draining") == 0
        _drain(server)
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert health.headers["retry-after"] == "1"
        assert client.get("/v1/health").status_code == 503
        live = client.get("/livez")
        assert live.status_code == 200 and live.json()["status"] == "alive"
        answered = client.post("/v1/chat/completions", json=CHAT)  # a request still sent is served
        assert answered.status_code == 200 and answered.json()["choices"][0]["finish_reason"]
        assert _metric(client.get("/metrics").text, "zinc_draining") == 1


def test_liveness_needs_no_api_key() -> None:
    running = RunningServer(FakeEngine(), api_key="secret")
    try:
        with _client(running) as client:
            assert client.get("/livez").status_code == 200
            assert client.get("/health").status_code == 200
            assert client.get("/metrics").status_code == 401
    finally:
        running.stop()


def test_metrics_report_prefix_cache_hits_and_kv_utilization(server: RunningServer) -> None:
    with _client(server) as client:
        first = client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"}).json()["usage"]
        second = client.post("/v1/chat/completions", json={**CHAT, "session_id": "s"}).json()["usage"]
        text = client.get("/metrics").text
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert _metric(text, "zinc_prompt_cached_tokens_total") == cached
    ratio = _metric(text, "zinc_prefix_cache_hit_ratio")
    assert ratio == pytest.approx(cached / (first["prompt_tokens"] + second["prompt_tokens"]))
    assert 0 <= _metric(text, "zinc_kv_cache_utilization") <= 1
    assert _metric(text, "zinc_requests_queued") == 0
