"""`zinc serve` end to end with the real SmolLM2 on the CPU: the official openai client (sync and
async, chat and completions, streaming and not), stop sequences, and an abrupt disconnect."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from tests.conftest import GOLDEN
from tests.e2e.test_server_fake_engine import RunningServer
from zinc.engine.engine import LocalEngine

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def srv(engine: LocalEngine) -> Iterator[RunningServer]:
    running = RunningServer(engine)  # type: ignore[arg-type]
    yield running
    running.stop()


@pytest.fixture
def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)


def golden_text(engine: LocalEngine, n: int) -> str:
    data = json.loads((GOLDEN / "smollm2.json").read_text())
    ids = next(p for p in data["prompts"] if p["text"] == PROMPT)["generated_ids"]
    return engine.detokenize(ids[:n])


def test_completion_matches_llama_cpp(client: openai.OpenAI, engine: LocalEngine) -> None:
    out = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=5, temperature=0)
    assert out.choices[0].text == golden_text(engine, 5) == " Paris.\n\nThe"
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (5, 5)
    streamed = client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == " Paris.\n\nThe"


def test_stop_sequence(client: openai.OpenAI) -> None:
    out = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, stop=["\n"])
    assert out.choices[0].text == " Paris."
    assert out.choices[0].finish_reason == "stop"


def test_chat_sync_and_async_stream(client: openai.OpenAI, srv: RunningServer, engine: LocalEngine) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    # The first request prefills the whole prompt; the streamed one finds its pages in the prefix
    # cache. The first token is a near-tie (0.1 logit on the int8 path), so this also checks that
    # reusing cached pages changes no bit.
    out = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=6)  # type: ignore[arg-type]
    text = out.choices[0].message.content
    assert out.choices[0].message.role == "assistant" and text
    prompt_ids = engine.chat.encode(engine.tokenizer, messages)
    assert out.usage is not None and out.usage.prompt_tokens == len(prompt_ids)

    async def stream() -> tuple[str, int]:
        aclient = openai.AsyncOpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        chunks = await aclient.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=6, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        pieces, usage = [], 0
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        await aclient.close()
        return "".join(pieces), usage

    streamed, completion_tokens = asyncio.run(stream())
    assert streamed == text  # greedy: the stream and the whole response agree
    assert completion_tokens == out.usage.completion_tokens


def finished(srv: RunningServer, reason: str) -> float:
    """Generations the server has seen end with `reason` (its /metrics counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf'^zinc_generations_total{{finish_reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_disconnect_stops_generation(srv: RunningServer, engine: LocalEngine, client: openai.OpenAI) -> None:
    """The gone client's generation is aborted (the server counts it so), not run to its 400
    tokens; no bound on how long that takes is asserted, only that it happens (within 10 s)."""
    aborted, lengths = finished(srv, "aborted"), finished(srv, "length")
    body = json.dumps({"model": "smollm2", "prompt": PROMPT, "max_tokens": 400, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )  # fmt: skip
    assert b"data: " in sock.recv(65536)  # the stream has started
    sock.close()
    start = time.monotonic()
    while engine.stats().active_requests and time.monotonic() - start < 10:
        time.sleep(0.05)
    assert engine.stats().active_requests == 0, "generation kept running after the client left"
    assert finished(srv, "aborted") == aborted + 1 and finished(srv, "length") == lengths
    out = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=1)
    assert out.choices[0].text == " Paris"


def test_health_reports_model_and_memory(srv: RunningServer, engine: LocalEngine) -> None:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    health = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert health["status"] == "ok" and health["model"] == "smollm2"
    assert health["active_requests"] == 0 and health["gpu_context_tokens"] == 0
    assert health["gpu_memory_weights_bytes"] > 90_000_000  # SmolLM2 Q4_1's tensors
    assert health["gpu_context_reserved_bytes"] == engine.session.kv_cache_bytes() > 0
    kv = health["kv_cache"]
    assert (
        health["gpu_context_capacity_tokens"] == kv["total_pages"] * kv["page_size"] >= engine.context_length
    )
